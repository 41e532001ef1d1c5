"""Varied test sentences: they live in ``benchmarks.texts`` (the text-task benchmark uses them too); and
the rerank tests' query with its documents (two answer it, one is about its subject, two are off it,
one is empty)."""

from benchmarks.texts import LONG, SENTENCES

__all__ = ["DOCS", "LONG", "QUERY", "SENTENCES"]

QUERY = "How many people live in Berlin?"
DOCS = [
    "Berlin has a population of 3.5 million registered inhabitants.",
    "The capital of France is Paris.",
    "Berlin is well known for its museums.",
    "Cats sleep most of the day.",
    "About 3.7 million people lived in Berlin in 2023, making it the EU's most populous city.",
    "",
]
