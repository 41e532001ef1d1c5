"""scripts/profile_server.py's summary of py-spy's raw samples: shares per thread and the hottest Python frames,
from a file whose frame names may hold bytes that are not UTF-8 (py-spy writes a native frame's name as it is)."""

from __future__ import annotations

import importlib.util

from tests.infra.conftest import ROOT


def _module():
    spec = importlib.util.spec_from_file_location("profile_server", ROOT / "scripts" / "profile_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _summarize():
    return _module().summarize


def test_summary_of_samples_with_bytes_that_are_not_utf8(tmp_path):
    raw = tmp_path / "samples.txt"
    raw.write_bytes(
        b"thread (1): MainThread;run (asyncio/runners.py:118);encode (core/tokenization.py:53) 30\n"
        b"thread (1): MainThread;run (asyncio/runners.py:118);select (selectors.py:468) 50\n"
        b"thread (2): infer-bench_0;_run_batch (core/engine.py:9);Session.run (onnxruntime/x.py:406) 15\n"
        b"thread (2): infer-bench_0;_run_batch (core/engine.py:9);native \xf5\xff (libx.so) 5\n")
    summary = _summarize()(raw)
    assert summary["threads"]["MainThread"] == {"runtime": 0.0, "python": 37.5, "waiting": 62.5, "samples": 80}
    assert summary["threads"]["infer-bench_0"] == {"runtime": 75.0, "python": 25.0, "waiting": 0.0, "samples": 20}
    frames = dict(summary["hot_python_frames"])
    assert frames["encode (core/tokenization.py:53)"] == round(100 * 30 / 35, 1)
    assert any(frame.startswith("native ") for frame in frames)


def test_the_loop_threads_hottest_frames_c_included(tmp_path):
    raw = tmp_path / "samples.txt"
    raw.write_bytes(
        b"thread (1): MainThread;run (asyncio/runners.py:118);gc_collect_main (libpython3.11.so.1.0) 12\n"
        b"thread (1): MainThread;run (asyncio/runners.py:118);current_task (asyncio/tasks.py:1);getpid (libc.so.6) 8\n"
        b"thread (1): MainThread;run (asyncio/runners.py:118);encode (core/tokenization.py:53) 20\n"
        b"thread (1): MainThread;run (asyncio/runners.py:118);native \xf5\xff (libx.so) 10\n"
        b"thread (2): infer-bench_0;_run_batch (core/engine.py:9);getpid (libc.so.6) 50\n")
    samples, frames = _module().hottest_frames(raw)
    assert samples == 50  # the loop thread's own samples only
    shares = dict(frames)
    assert shares["encode (core/tokenization.py:53)"] == 40.0
    assert shares["gc_collect_main (libpython3.11.so.1.0)"] == 24.0
    assert shares["getpid (libc.so.6)"] == 16.0
    assert [f for f, _ in frames][0] == "encode (core/tokenization.py:53)"
