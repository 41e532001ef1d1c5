"""The built-in retrieval set: two disjoint splits of real docstring pairs, regenerated the same from source."""

import sysconfig
from pathlib import Path

from core.quality.data import builtin_pairs, docstring_pairs


def test_splits_are_disjoint_and_large_enough():
    calibration, holdout = builtin_pairs("calibration"), builtin_pairs("holdout")
    assert len(calibration.queries) == 1000 and len(holdout.queries) >= 1500
    for pairs in (calibration, holdout):
        assert len(set(pairs.documents)) == len(pairs.documents) == len(pairs.queries)
        assert pairs.relevant == [{i} for i in range(len(pairs.queries))]
    assert not set(calibration.queries) & set(holdout.queries)
    assert not set(calibration.documents) & set(holdout.documents)
    assert builtin_pairs("holdout") == holdout  # deterministic


def test_shipped_pairs_are_the_docstrings_of_their_source():
    """A module's pairs, regenerated from this Python's own file, are in the shipped set as read."""
    root = Path(sysconfig.get_paths()["stdlib"])
    shipped = {pair for split in ("calibration", "holdout")
               for pair in zip(*(getattr(builtin_pairs(split), f) for f in ("queries", "documents", "sources")))}
    regenerated = docstring_pairs(root / "json")
    assert len(regenerated) >= 5
    for source in regenerated:  # json/ has no duplicate docstrings with the rest of the library
        assert (source["query"], source["document"], "json/" + source["source"]) in shipped
