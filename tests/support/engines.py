"""Build one in-process Engine from a folder (the same load path as the server): ``benchmarks.inprocess``
holds it (the benchmarks load engines the same way)."""

from benchmarks.inprocess import load_engine

__all__ = ["load_engine"]
