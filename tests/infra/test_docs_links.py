"""What README.md and the docs pages (docs/*.md, docs/*/*.md) point at exists: every relative link's file
and, for a ``#anchor``, a heading of that page with that anchor (GitHub's rule); every path of the project's
code a page names (``core/...``, ``adapters/...``, ``scripts/...``, ``benchmarks/...``) is a file or folder
of the tree; and so is every folder docs/architecture.md's Folders block draws."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from .conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").glob("*/*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
#: a path of the code: one of these folders, then path characters (``{a,b}`` alternatives expanded)
CODE_PATH = re.compile(r"(?<![\w./-])((?:core|adapters|scripts|benchmarks)/[\w./{},*<>-]*)")


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped, spaces to hyphens;
    a repeated one gets -1, -2, …"""
    seen: dict[str, int] = {}
    found = set()
    for line in _without_code_blocks(page.read_text()).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1))  # a link's text only
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: Path) -> list[str]:
    return LINK.findall(_without_code_blocks(page.read_text()))


def test_the_anchor_rule_is_githubs(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Benchmarks\n## SageMaker `serve` start\n## One thread for torch (2026-12-05)\n"
                    "## Lambda cold start\n## Lambda cold start\n```bash\n# not a heading\n```\n"
                    "### [gpu-bench.md](gpu-bench.md), step 2: run\n")
    assert anchors(page) == {"benchmarks", "sagemaker-serve-start", "one-thread-for-torch-2026-12-05",
                             "lambda-cold-start", "lambda-cold-start-1", "gpu-benchmd-step-2-run"}


def test_every_relative_link_and_anchor_exists():
    broken = []
    for page in PAGES:
        for target in links(page):
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading in {file.relative_to(ROOT)})")
    assert not broken, "\n".join(broken)


def _expand(path: str) -> list[str]:
    """``a/{b,c}.py`` → ``a/b.py``, ``a/c.py``."""
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def code_paths(text: str) -> list[str]:
    """The code paths ``text`` names (patterns with ``*``, ``<...>`` or a placeholder such as ``NAME`` and
    trailing punctuation left out)."""
    found = []
    for raw in CODE_PATH.findall(text):
        raw = raw.rstrip(".,")
        if re.search(r"[*<>]|/[A-Z][A-Z_]+\b", raw) or raw.count("{") != raw.count("}"):
            continue
        found.extend(_expand(raw))
    return found


def test_code_paths_are_found():
    text = ("`core/api/middleware.py`, core/tasks/, core/api/routes/{embeddings,tei}.py, scripts/bench*.py, "
            "(see core/torch_thread.py). scripts/NAME.py and my_core/x.py, docs/core/x.md, "
            "docs/bench/compare-<task>.json")
    assert code_paths(text) == ["core/api/middleware.py", "core/tasks/", "core/api/routes/embeddings.py",
                                "core/api/routes/tei.py", "core/torch_thread.py"]


def test_every_code_path_a_page_names_exists():
    missing = [f"{page.relative_to(ROOT)}: {path}" for page in PAGES for path in code_paths(page.read_text())
               if not (ROOT / path).exists()]
    assert not missing, "pages name paths that are not in the tree:\n" + "\n".join(missing)


def folders_block(text: str) -> list[str]:
    """The folders the text block under architecture.md's "## Folders" draws, as paths (a line's indent of
    two spaces per level puts it under the folder above)."""
    section = text.split("\n## Folders\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    stack: list[str] = []
    found = []
    for line in block.splitlines():
        match = re.match(r"^( *)(\S+)", line)
        if not match or not match.group(2).endswith("/"):
            continue  # a description's continuation, or a pattern such as *.py
        depth = len(match.group(1)) // 2
        stack[depth:] = [match.group(2)]
        found.append("".join(stack))
    return found


def test_the_folders_block_is_read():
    text = ("x\n## Folders\n\n```text\ncore/    a\n  api/   b\n    routes/  c\n         more\n  *.py  d\n"
            "benchmarks/  e\n```\n")
    assert folders_block(text) == ["core/", "core/api/", "core/api/routes/", "benchmarks/"]


def test_the_architecture_page_draws_folders_of_the_tree():
    folders = folders_block((ROOT / "docs" / "architecture.md").read_text())
    assert "core/backends/" in folders
    missing = [f for f in folders if not (ROOT / f).is_dir()]
    assert not missing, f"docs/architecture.md's Folders block draws folders that are not in the tree: {missing}"
