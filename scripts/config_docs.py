#!/usr/bin/env python3
"""Write the settings and model-spec tables of docs/configuration.md from ``Settings`` and ``ModelSpec``
(every option, its variable, its default and its description; the spec's fields every backend reads, then
each backend's own options, as the backends declare them: ``core.config.BACKEND_OPTIONS``), between the
``<!-- generated:NAME -->`` and ``<!-- end:NAME -->`` markers; the prose around them is kept.

    .venv/bin/python scripts/config_docs.py          # rewrite the tables
    .venv/bin/python scripts/config_docs.py --check  # exit 1 when the file differs from the code
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from pydantic.fields import FieldInfo

from core.backends.catalog import names as backend_names
from core.config import BACKEND_OPTIONS, ModelSpec, Settings

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
#: defaults that depend on the machine or on other fields, as the docs state them
DEFAULT_TEXT = {
    ("settings", "threads"): "the CPUs this process may use",
    ("settings", "models"): "the embedded all-MiniLM-L6-v2",
    ("settings", "cache_dir"): "`~/.cache/tessera` (`$XDG_CACHE_HOME/tessera`; macOS `~/Library/Caches/tessera`)",
    ("spec", "name"): "the folder name",
    ("spec", "max_batch_tokens"): "512 on CPU, 16384 on accelerators",
    ("spec", "threads"): "the `threads` setting",
    ("onnx", "workers"): "2 on CPU with 2+ threads, else 1",
}


def _default(table: str, name: str, field: FieldInfo) -> str:
    if (table, name) in DEFAULT_TEXT:
        return DEFAULT_TEXT[(table, name)]
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "—"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`" if value not in ([], {}) else f"`{value!r}`"


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def settings_table() -> str:
    rows = ["| setting | env | default | meaning |", "|---|---|---|---|"]
    for name, field in Settings.model_fields.items():
        rows.append(f"| `{name}` | `TESSERA_{name.upper()}` | {_default('settings', name, field)} | "
                    f"{_cell(field.description)} |")
    return "\n".join(rows)


def spec_groups() -> dict[str | None, list[str]]:
    """The spec's fields by the one backend that reads them (None: every backend), in declaration order;
    a backend's are its options' fields (``onnx.workers`` is ``workers`` under ``onnx``)."""
    groups: dict[str | None, list[str]] = {None: [n for n in ModelSpec.model_fields if n not in BACKEND_OPTIONS]}
    for backend, model in BACKEND_OPTIONS.items():
        groups[backend] = list(model.model_fields)
    return groups


def spec_table() -> str:
    """One table per group: the fields every backend reads, then each backend's own options."""
    groups = spec_groups()
    parts = []
    for backend, names in groups.items():
        if backend is None:
            rows = ["| field | default | meaning |", "|---|---|---|"]
            for name in names:
                field = ModelSpec.model_fields[name]
                rows.append(f"| `{name}` | {_default('spec', name, field)} | {_cell(field.description)} |")
            parts.append("### Every backend\n\n" + "\n".join(rows))
            continue
        model = BACKEND_OPTIONS[backend]
        flat = {field: key for key, field in model.flat.items()}
        title = (f"### `backend: {backend}` only\n\nRead by the {backend} backend alone (also under `backend: auto` "
                 f"when it chooses {backend}); the other backends ignore them. Nested under `{backend}:` "
                 f"(`{backend}: {{{names[0]}: ...}}`); the flat key of the second column sets the same option.")
        rows = ["| field | flat key | default | meaning |", "|---|---|---|---|"]
        for name in names:
            field = model.model_fields[name]
            key = f"`{flat[name]}`" if name in flat else "—"
            rows.append(f"| `{backend}.{name}` | {key} | {_default(backend, name, field)} | {_cell(field.description)} |")
        parts.append(title + "\n\n" + "\n".join(rows))
    bare = [f"`{b}`" for b in backend_names() if b not in groups]
    if bare:
        parts.append(f"{' and '.join(bare) if len(bare) < 3 else ', '.join(bare)}: no options of their own.")
    return "\n\n".join(parts)


def render(text: str) -> str:
    for name, table in (("settings", settings_table()), ("spec", spec_table())):
        pattern = re.compile(rf"(<!-- generated:{name} -->\n).*?(<!-- end:{name} -->)", re.S)
        if not pattern.search(text):
            raise SystemExit(f"{DOC}: markers <!-- generated:{name} --> / <!-- end:{name} --> not found")
        text = pattern.sub(lambda m: m.group(1) + table + "\n" + m.group(2), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if the file is out of date")
    args = parser.parse_args(argv)
    current = DOC.read_text()
    wanted = render(current)
    if args.check:
        if current != wanted:
            print(f"{DOC} is out of date: run scripts/config_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
