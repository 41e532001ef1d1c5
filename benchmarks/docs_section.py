"""The GPU section of docs/benchmarks.md: the text between two markers, replaced by a run's Markdown."""

from __future__ import annotations

from pathlib import Path

START_MARKER = "<!-- gpu-bench:start -->"
END_MARKER = "<!-- gpu-bench:end -->"


def replace_section(doc: str, section: str) -> str:
    """``doc`` with the text between the gpu-bench markers replaced by ``section`` (markers inside
    ``section`` itself, as in a whole file written by the GPU benchmark, are dropped first)."""
    if doc.count(START_MARKER) != 1 or doc.count(END_MARKER) != 1:
        raise ValueError(f"expected exactly one {START_MARKER} and one {END_MARKER}")
    head, rest = doc.split(START_MARKER)
    if END_MARKER not in rest:
        raise ValueError(f"{END_MARKER} comes before {START_MARKER}")
    _, tail = rest.split(END_MARKER)
    if START_MARKER in section or END_MARKER in section:
        if section.count(START_MARKER) != 1 or section.count(END_MARKER) != 1:
            raise ValueError("the section has unbalanced gpu-bench markers")
        section = section.split(START_MARKER, 1)[1].split(END_MARKER, 1)[0]
    return f"{head}{START_MARKER}\n{section.strip()}\n{END_MARKER}{tail}"


def merge(section_file: Path, doc_file: Path) -> None:
    doc_file.write_text(replace_section(doc_file.read_text(), section_file.read_text()))
    print(f"replaced the gpu-bench section of {doc_file} with {section_file}")
