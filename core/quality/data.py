"""The built-in retrieval set: real, human-written (query, relevant document) pairs, shipped with the package.

Source: the docstrings of the Python 3.11 standard library (CPython's ``Lib/``, tests left out), read with ``ast``
(nothing imported or run). A docstring's summary — its first paragraph — is the query, and the rest of the same
docstring, the explanation its author wrote under it, is the one relevant document: "Return the number of
items in a deque equal to x." → the text that documents that function. Each function, class and module whose
summary has at least 3 words and whose body at least 8 counts, once: a summary or a body that occurs in more
than one docstring is left out, so every document is distinct and every query has exactly one answer.

The pairs are generated once by ``scripts/build_quality_pairs.py`` into ``builtin_pairs.jsonl.gz`` beside this
module (about 2,700 pairs), so the set is the same on every machine and Python version and needs no download.
Two disjoint splits, by a hash of the query text: ``calibration`` (1,000 pairs; what a gate may tune and decide
on) and ``holdout`` (the rest, ≥ 1,500; where figures are reported). Within a split, each pair's document is
searched for among that split's documents only.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

PAIRS_FILE = Path(__file__).with_name("builtin_pairs.jsonl.gz")
SPLITS = ("calibration", "holdout")
CALIBRATION_SIZE = 1000
MIN_QUERY_WORDS = 3
MIN_DOCUMENT_WORDS = 8
#: folders of the standard library whose docstrings are test scaffolding, not documentation
_LEFT_OUT = {"test", "tests", "idle_test", "site-packages"}


@dataclass(frozen=True)
class PairSet:
    """Queries, documents and, per query, the indices of its relevant documents (here: exactly one each)."""

    name: str
    queries: list[str]
    documents: list[str]
    relevant: list[set[int]]
    sources: list[str]  # where each pair comes from: "module/path.py:QualName"


def builtin_pairs(split: str) -> PairSet:
    """The ``calibration`` or ``holdout`` split of the built-in set (read once per process)."""
    if split not in SPLITS:
        raise ValueError(f"unknown built-in split {split!r}; choose one of {', '.join(SPLITS)}")
    pairs = [pair for pair in _shipped_pairs() if split_of(pair["query"], _calibration_queries()) == split]
    return PairSet(name=f"builtin:{split}", queries=[pair["query"] for pair in pairs],
                   documents=[pair["document"] for pair in pairs], relevant=[{i} for i in range(len(pairs))],
                   sources=[pair["source"] for pair in pairs])


def split_of(query: str, calibration: frozenset[str]) -> str:
    return "calibration" if query in calibration else "holdout"


@lru_cache(maxsize=1)
def _shipped_pairs() -> tuple[dict, ...]:
    with gzip.open(PAIRS_FILE, "rt", encoding="utf-8") as stream:
        return tuple(json.loads(line) for line in stream)


@lru_cache(maxsize=1)
def _calibration_queries() -> frozenset[str]:
    """The ``CALIBRATION_SIZE`` queries that sort first by their SHA-256: a fixed, content-defined draw."""
    ranked = sorted((pair["query"] for pair in _shipped_pairs()), key=_digest)
    return frozenset(ranked[:CALIBRATION_SIZE])


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def docstring_pairs(root: Path) -> list[dict]:
    """(summary, body) pairs of every docstring under ``root`` (a standard library folder), in path order,
    without the summaries or bodies that occur more than once."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if _LEFT_OUT & set(relative.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):  # the library's own bad-syntax samples (lib2to3 fixtures)
            continue
        found.extend(_pairs_of(tree, relative.as_posix()))
    queries = _counts(pair["query"] for pair in found)
    documents = _counts(pair["document"] for pair in found)
    return [pair for pair in found if queries[pair["query"]] == 1 and documents[pair["document"]] == 1]


def _pairs_of(tree: ast.Module, module: str) -> list[dict]:
    pairs = []
    for node, name in _documented(tree, ""):
        summary, _, body = (ast.get_docstring(node) or "").partition("\n\n")
        query, document = " ".join(summary.split()), " ".join(body.split())
        if len(query.split()) >= MIN_QUERY_WORDS and len(document.split()) >= MIN_DOCUMENT_WORDS:
            pairs.append({"query": query, "document": document, "source": f"{module}:{name}"})
    return pairs


def _documented(node: ast.AST, prefix: str):
    """The module, then each class and function (nested ones too) with its qualified name, in source order."""
    if isinstance(node, ast.Module):
        yield node, "<module>"
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{child.name}"
            yield child, name
            yield from _documented(child, f"{name}.")
        elif not isinstance(child, ast.expr):
            yield from _documented(child, prefix)  # definitions under if / try / with blocks


def _counts(texts) -> dict[str, int]:
    counts: dict[str, int] = {}
    for text in texts:
        counts[text] = counts.get(text, 0) + 1
    return counts
