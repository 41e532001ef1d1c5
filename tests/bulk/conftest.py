"""Corpora for the bulk job's tests, written by each test into its own temporary folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.texts import make_texts


def corpus(n: int, repeats: int = 0, seed: int = 0) -> list[str]:
    """``n`` rows: ``n - repeats`` distinct short texts, then ``repeats`` of them again (spread through)."""
    texts = make_texts("short", n - repeats, seed=seed)
    out = list(texts)
    for i in range(repeats):
        out.insert((i * 7919) % len(out), texts[(i * 31) % len(texts)])
    return out


def write_jsonl(path: Path, texts: list[str], ids: list | None = None) -> Path:
    with open(path, "w") as handle:
        for i, text in enumerate(texts):
            row = {"text": text}
            if ids is not None:
                row["doc_id"] = ids[i]
            handle.write(json.dumps(row) + "\n")
    return path


@pytest.fixture(scope="session")
def job_model(minilm_onnx_dir) -> dict:
    return {"path": str(minilm_onnx_dir), "name": "minilm", "backend": "onnx"}
