"""What a process restored from a memory snapshot must not share with its siblings: its random state.

Every process restored from one snapshot (Lambda SnapStart, Modal memory snapshots) starts with the same
generator state; ``reseed_random`` draws fresh seeds from the OS for Python's ``random`` and, where they
are loaded (never imported here), numpy's global generator and torch's default generators (CUDA's lazily,
when CUDA is initialised later)."""

from __future__ import annotations

import random
import sys


def reseed_random() -> list[str]:
    """Re-seed the process's global generators from the OS; returns the names of those re-seeded."""
    random.seed()
    seeded = ["random"]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
        seeded.append("numpy")
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "seed"):
        torch.seed()  # a non-deterministic seed for the CPU generator, queued for CUDA's (no CUDA query)
        seeded.append("torch")
    return seeded
