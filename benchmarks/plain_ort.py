"""The baseline a user writes by hand: the plain ``torch.onnx.export`` graph in an ONNX Runtime session,
tokenize → run → the task's post-processing (embeddings: mean-pool → normalize; rerank: sigmoid of the
pair's logit; classify: softmax over the labels), in one process. Its rate is the runtime's own limit,
the denominator of the "Tessera/plain" ratio in docs/benchmarks.md (CLIP, served with torch:
``benchmarks/plain_torch.py``)."""

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


def plain_pair_feeds_maker(tokenizer_json: Path, max_length: int = 512):
    """(query, documents) → ONNX feeds of the pairs: the fast tokenizer's pair encoding (segment ids
    0/1), truncated to ``max_length``, padded to the longest pair."""
    import numpy as np
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.enable_truncation(max_length)
    tok.enable_padding()

    def feeds(query: str, documents: list[str]) -> dict:
        enc = tok.encode_batch([(query, d) for d in documents])
        return {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in enc], dtype=np.int64)}

    return feeds


def plain_ort_reranker(graph: Path, tokenizer_json: Path, threads: int, max_length: int = 512):
    """A cross-encoder graph by hand: (query, documents) → the sigmoid of each pair's logit (float32)."""
    import numpy as np

    feeds_for, run = plain_pair_feeds_maker(tokenizer_json, max_length), plain_session(graph, threads)

    def rerank(query: str, documents: list[str]) -> np.ndarray:
        logits = run(feeds_for(query, documents))[:, 0]
        return (1 / (1 + np.exp(-logits))).astype(np.float32)

    return rerank


def plain_ort_classifier(graph: Path, tokenizer_json: Path, threads: int, max_length: int = 512):
    """A sequence-classification graph by hand: texts → softmax over the labels, one row per text."""
    import numpy as np

    feeds_for, run = plain_feeds_maker(tokenizer_json, max_length), plain_session(graph, threads)

    def classify(texts: list[str]) -> np.ndarray:
        logits = run(feeds_for(texts))
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)

    return classify


def timed_rate(call, chunks: list, duration: float) -> float:
    """Calls ``call(chunk)`` over ``chunks`` in order for ``duration`` seconds (after one warm-up call).
    Returns items/s (the items of the chunks called)."""
    call(chunks[0])
    done, items, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        chunk = chunks[done % len(chunks)]
        call(chunk)
        done, items = done + 1, items + len(chunk)
    return items / (time.perf_counter() - start)


def batches(items: list, batch: int) -> list[list]:
    return [items[i:i + batch] for i in range(0, len(items) - batch + 1, batch)]


def plain_ort_loop(graph: Path, tokenizer_json: Path, texts: list[str], batch: int, duration: float,
                   threads: int, max_length: int = 256) -> float:
    """Times ``plain_ort_embedder`` over ``texts`` in order, in batches of ``batch``, in one process with
    ``threads`` cores, for ``duration`` seconds (after one warm-up batch). Returns embeddings/s."""
    return timed_rate(plain_ort_embedder(graph, tokenizer_json, threads, max_length), batches(texts, batch), duration)
