"""scripts/profile_server.py's summary of py-spy's raw samples: shares per thread and the hottest Python frames,
from a file whose frame names may hold bytes that are not UTF-8 (py-spy writes a native frame's name as it is)."""

from __future__ import annotations

import importlib.util

from tests.infra.conftest import ROOT


def _summarize():
    spec = importlib.util.spec_from_file_location("profile_server", ROOT / "scripts" / "profile_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.summarize


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
