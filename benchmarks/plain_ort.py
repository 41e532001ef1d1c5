"""The baseline a user writes by hand: the plain ``torch.onnx.export`` graph in an ONNX Runtime session,
tokenize → run → mean-pool → normalize, in one process. Its rate is the runtime's own limit, the
denominator of the "Tessera/plain" ratio in docs/benchmarks.md."""

from __future__ import annotations

import time
from pathlib import Path


def plain_feeds_maker(tokenizer_json: Path, max_length: int = 256):
    """texts → ONNX feeds the way a user writes it: the fast tokenizer, truncated to ``max_length``,
    each call padded to its longest text; int64 ids, mask and zero token types."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.enable_truncation(max_length)
    tok.enable_padding()

    def feeds(texts: list[str]) -> dict:
        enc = tok.encode_batch(texts)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}

    return feeds


def plain_session(graph: Path, threads: int):
    """An ONNX Runtime CPU session with default optimisations and ``threads`` intra-op threads.
    Returns feeds → the graph's first output (the inputs the graph lacks are dropped)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    session = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def run(feeds: dict):
        return session.run(None, {k: v for k, v in feeds.items() if k in names})[0]

    return run


def mean_pool(hidden, mask):
    import numpy as np

    m = mask[:, :, None].astype(np.float32)
    return (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)


def plain_ort_embedder(graph: Path, tokenizer_json: Path, threads: int, max_length: int = 256):
    """The plain graph in an ONNX Runtime session (default optimisations, ``threads`` intra-op threads);
    each call pads its texts to the longest, tokenize → run → mean-pool → normalize. Returns the embed
    function (texts → float32 array)."""
    import numpy as np

    feeds_for, run = plain_feeds_maker(tokenizer_json, max_length), plain_session(graph, threads)

    def embed(chunk: list[str]) -> np.ndarray:
        feeds = feeds_for(chunk)
        pooled = mean_pool(run(feeds), feeds["attention_mask"])
        return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)

    return embed


def plain_ort_loop(graph: Path, tokenizer_json: Path, texts: list[str], batch: int, duration: float,
                   threads: int, max_length: int = 256) -> float:
    """Times ``plain_ort_embedder`` over ``texts`` in order, in batches of ``batch``, in one process with
    ``threads`` cores, for ``duration`` seconds (after one warm-up batch). Returns embeddings/s."""
    embed = plain_ort_embedder(graph, tokenizer_json, threads, max_length)
    chunks = [texts[i:i + batch] for i in range(0, len(texts) - batch + 1, batch)]
    embed(chunks[0])
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        embed(chunks[done % len(chunks)])
        done += 1
    return done * batch / (time.perf_counter() - start)
