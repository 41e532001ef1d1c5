"""``workers: 2`` on the ONNX backend: overlapping batches, and batches the batcher says should share (a full batch
queued behind them), run on a second, narrower session and give the same embeddings as one batch at a time; a
batch that runs alone, with nothing or only a partial batch behind it, keeps the full session."""

from __future__ import annotations

import asyncio

import numpy as np

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.tasks.embed import EmbedRequest

SETTINGS = Settings(threads=2)


class CountingSession:
    """The real ONNX Runtime session, with its calls counted (the runs still happen in the runtime)."""

    def __init__(self, session):
        self.session = session
        self.calls = 0

    def run(self, *args, **kwargs):
        self.calls += 1
        return self.session.run(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.session, name)


def embed(engine: Engine, texts: list[str]) -> np.ndarray:
    return engine.run_sync(EmbedRequest(texts=texts)).vectors


def test_overlapping_batches_use_the_second_session_and_match(minilm_onnx_dir, sentences):
    one = Engine.load(ModelSpec(path=minilm_onnx_dir, backend="onnx", workers=1), SETTINGS)
    two = Engine.load(ModelSpec(path=minilm_onnx_dir, backend="onnx", workers=2, max_batch_size=4), SETTINGS)
    assert one.describe()["lanes"] == 1 and two.describe()["lanes"] == 2
    full, shared = CountingSession(two.backend._session), CountingSession(two.backend._shared)
    two.backend._session, two.backend._shared = full, shared

    texts = sentences[:32]
    reference = embed(one, texts)

    async def serve():
        await two.batcher.start()
        try:  # 32 single-text requests at once: batches of 4 on two workers overlap
            return await asyncio.gather(*(two(EmbedRequest(texts=[t])) for t in texts))
        finally:
            await two.batcher.stop()

    answers = asyncio.run(serve())
    got = np.concatenate([a.vectors for a in answers])
    assert shared.calls > 0  # 32 requests queued: batches of 4 with work behind them take a lane each
    np.testing.assert_allclose(got, reference, atol=2e-5)


def test_a_lone_batch_keeps_the_full_session(minilm_onnx_dir, sentences):
    two = Engine.load(ModelSpec(path=minilm_onnx_dir, backend="onnx", workers=2), SETTINGS)
    full, shared = CountingSession(two.backend._session), CountingSession(two.backend._shared)
    two.backend._session, two.backend._shared = full, shared
    for t in sentences[:3]:
        embed(two, [t])
    assert (full.calls, shared.calls) == (3, 0)


def test_a_batch_the_batcher_says_to_share_takes_a_lane(minilm_onnx_dir, sentences):
    """The engine gives the backend its batcher's answer (``Batcher.should_share_threads``); a batch told to share
    takes the narrower session even when it runs alone (the next batch is about to run beside it), and gives the
    same vectors."""
    two = Engine.load(ModelSpec(path=minilm_onnx_dir, backend="onnx", workers=2), SETTINGS)
    assert two.backend.share_threads == two.batcher.should_share_threads and two.backend.share_threads() is False
    reference = embed(two, sentences[:1])
    full, shared = CountingSession(two.backend._session), CountingSession(two.backend._shared)
    two.backend._session, two.backend._shared = full, shared
    two.backend.share_threads = lambda: True
    got = embed(two, sentences[:1])
    assert (full.calls, shared.calls) == (0, 1)
    np.testing.assert_allclose(got, reference, atol=2e-5)


def test_a_batch_with_a_partial_batch_behind_it_keeps_every_thread(minilm_onnx_dir, sentences):
    """Six one-text requests at once, four items a batch: the first batch leaves two behind, a partial batch that
    waits for it to end, so it runs alone and takes the full session; so does the second. (Before, any work
    queued behind a batch sent it to the narrower session, and with the partial batch held back one core idled.)"""
    two = Engine.load(ModelSpec(path=minilm_onnx_dir, backend="onnx", workers=2, max_batch_size=4), SETTINGS)
    full, shared = CountingSession(two.backend._session), CountingSession(two.backend._shared)
    two.backend._session, two.backend._shared = full, shared
    texts = sentences[:6]

    async def serve():
        await two.batcher.start()
        try:
            return await asyncio.gather(*(two(EmbedRequest(texts=[t])) for t in texts))
        finally:
            await two.batcher.stop()

    answers = asyncio.run(serve())
    assert (full.calls, shared.calls) == (2, 0)
    reference = embed(two, texts)
    np.testing.assert_allclose(np.concatenate([a.vectors for a in answers]), reference, atol=2e-5)


def test_workers_default_to_two_on_a_multi_core_cpu_and_one_otherwise(minilm_onnx_dir):
    """Unset ``workers``: two lanes on CPU with 2+ threads (the batcher runs two batches at once), one lane
    with one thread; an explicit value wins."""
    cases = [(Settings(threads=2), {}, 2), (Settings(threads=1), {}, 1), (Settings(threads=2), {"workers": 1}, 1)]
    for settings, extra, lanes in cases:
        engine = Engine.load(ModelSpec(path=minilm_onnx_dir, backend="onnx", **extra), settings)
        assert engine.backend.lanes == lanes and engine.batcher.workers == lanes, (settings.threads, extra)
        assert (engine.backend._shared is not None) == (lanes > 1)


def _entry(options, key: str) -> str | None:
    try:
        return options.get_session_config_entry(key)
    except RuntimeError:  # not set
        return None


def test_spin_settings_reach_both_sessions(minilm_onnx_dir):
    """``ort_spin``: true spins between runs too (ONNX Runtime's own default), "run" (the default) only while a run
    is in progress (the pool stops when the last concurrent run returns), false never; on both lanes' sessions."""
    expected = {True: ("1", None), "run": ("1", "1"), False: ("0", None)}
    assert ModelSpec(path=minilm_onnx_dir).onnx.spin == "run"
    for spin, (allow, force_stop) in expected.items():
        engine = Engine.load(ModelSpec(path=minilm_onnx_dir, backend="onnx", workers=2, ort_spin=spin), SETTINGS)
        for session in (engine.backend._session, engine.backend._shared):
            options = session.get_session_options()
            assert options.get_session_config_entry("session.intra_op.allow_spinning") == allow
            assert _entry(options, "session.force_spinning_stop") == force_stop
        assert embed(engine, ["spins or not, the same vectors"]).shape == (1, 384)
