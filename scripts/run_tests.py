"""Run the test suite the way ``scripts/test`` does: one pytest process per folder of ``tests/``.

The suite loads many models in-process (every backend, task and family), and a process keeps the memory
its allocators and runtimes took long after the models are gone: one pytest process for the whole suite
grows past the memory of a small machine. A process per folder gives each folder's memory back when it
exits; the session fixtures' artifacts are cached on disk (tests/support/cache.py), so a later folder
loads them instead of building them again.

Arguments go to pytest. When they name tests (a path under ``tests/``, with or without ``::``), pytest
runs just those, in one process. Otherwise every folder runs in turn with the same arguments, and the
last line counts the whole suite (``N passed, N failed, N skipped``); ``-x`` stops at the first folder
that fails."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
NO_TESTS_COLLECTED = 5  # pytest's exit code when a selection (-k, -m) matches nothing in a folder


def names_tests(args: list[str]) -> bool:
    """Whether an argument selects tests by path (then pytest runs as asked, in one process)."""
    return any(not arg.startswith("-") and (ROOT / arg.split("::")[0]).exists() for arg in args)


def folders() -> list[Path]:
    return sorted(p for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))


def counts(report: Path) -> dict[str, int]:
    """passed / failed / skipped from a JUnit XML report (errors count as failed)."""
    total = {"passed": 0, "failed": 0, "skipped": 0}
    if not report.exists():
        return total
    for suite in ET.parse(report).getroot().iter("testsuite"):
        tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
        failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        total["passed"] += tests - skipped - failed
        total["failed"] += failed
        total["skipped"] += skipped
    return total


def main(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest"]
    if names_tests(args):
        return subprocess.call([*pytest, *args], cwd=ROOT)
    stop_early = "-x" in args or "--exitfirst" in args
    total = {"passed": 0, "failed": 0, "skipped": 0}
    failed_folders = []
    with tempfile.TemporaryDirectory(prefix="tessera-tests-") as tmp:
        for folder in folders():
            name = folder.relative_to(ROOT).as_posix()
            print(f"== {name}", flush=True)
            report = Path(tmp) / f"{folder.name}.xml"
            code = subprocess.call([*pytest, *args, f"--junitxml={report}", name], cwd=ROOT)
            for key, value in counts(report).items():
                total[key] += value
            if code not in (0, NO_TESTS_COLLECTED):
                failed_folders.append(f"{name} (exit {code})")
                if stop_early:
                    break
    if failed_folders:
        print("failed folders: " + ", ".join(failed_folders), flush=True)
    print(f"suite: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped", flush=True)
    if failed_folders or total["failed"]:
        return 1
    return 0 if total["passed"] else NO_TESTS_COLLECTED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
