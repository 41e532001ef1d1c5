"""Varied test sentences: they live in ``benchmarks.texts`` (the text-task benchmark uses them too)."""

from benchmarks.texts import LONG, SENTENCES

__all__ = ["LONG", "SENTENCES"]
