"""scripts/run_tests.py: the suite in one pytest process per folder, counted as one."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_runner():
    spec = importlib.util.spec_from_file_location("run_tests", ROOT / "scripts" / "run_tests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arguments_that_name_tests_run_in_one_process_and_options_alone_run_every_folder():
    runner = load_runner()
    assert runner.names_tests(["-q", "tests/unit/test_config.py::test_defaults"])
    assert runner.names_tests(["tests/unit"])
    assert not runner.names_tests(["-q", "-k", "config"])
    assert not runner.names_tests(["-x"])
    folders = [p.name for p in runner.folders()]
    assert {"unit", "api", "adapters", "infra"} <= set(folders)
    assert "support" not in folders  # helpers, no tests


def test_counts_read_a_junit_report(tmp_path):
    runner = load_runner()
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "test_mix.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_ok_too(): pass\n"
        "def test_bad(): assert False\n"
        "@pytest.mark.skip(reason='x')\n"
        "def test_skipped(): pass\n")
    report = tmp_path / "r.xml"
    code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                            str(tmp_path / "t")], cwd=tmp_path, stdout=subprocess.DEVNULL)
    assert code == 1
    assert runner.counts(report) == {"passed": 2, "failed": 1, "skipped": 1}
    assert runner.counts(tmp_path / "missing.xml") == {"passed": 0, "failed": 0, "skipped": 0}
