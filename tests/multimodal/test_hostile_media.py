"""Hostile media against a real server process on loopback: a few kilobytes must not buy gigabytes,
minutes, a held thread or a 500. Each test measures the server process itself (peak RSS from
/proc/PID/status, wall-clock time) and checks that it keeps serving meanwhile."""

from __future__ import annotations

import io
import json
import struct
import threading
import time

import httpx
import pytest

from benchmarks.server import peak_rss_mb
from tests.multimodal.media_support import Route, data_uri, png
from tests.support.server import free_port, running_process, uvicorn_command

RED = png((40, 30), (255, 0, 0), shape="circle")


def _bomb_png(side: int = 5000) -> bytes:
    """A 1-bit PNG of side × side pixels: ~3 KB that decode to side² bytes and more after conversion."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (side, side)).save(buf, "PNG", optimize=True)
    return buf.getvalue()


def _wav_header(rate: int, frames: int = 1000) -> bytes:
    """A valid 16-bit mono PCM WAV whose header claims ``rate`` Hz."""
    pcm = b"\x00\x00" * frames
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, rate, (rate * 2) & 0xFFFFFFFF, 2, 16)
    return b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt " + fmt + b"data" + struct.pack("<I", len(pcm)) + pcm


@pytest.fixture(scope="module")
def hostile(clip_dir, clap_dir, media_server):
    """A server with two preparation threads (the default on two cores), media URLs opened for the loopback
    media server, a 10 s fetch limit and the default media budgets."""
    port = free_port()
    models = [{"path": str(clip_dir), "name": "tiny-clip"}, {"path": str(clap_dir), "name": "tiny-clap"}]
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": "/usr/bin:/bin",
           "TESSERA_MODELS": json.dumps(models), "TESSERA_MEDIA_ALLOW": '["127.0.0.1/32"]',
           "TESSERA_MEDIA_FETCH_TIMEOUT_S": "10", "TESSERA_THREADS": "2", "TESSERA_MAX_REQUEST_BYTES": str(8 << 20)}
    import os

    env = {**os.environ, **env}
    with running_process(uvicorn_command("core.dev:app", port), env, port=port, timeout=180,
                         name="hostile-media") as (base, proc):
        yield base, proc.pid


def _post(base: str, body: dict, timeout_header: float | None = None, timeout: float = 60) -> httpx.Response:
    headers = {"X-Request-Timeout": str(timeout_header)} if timeout_header else {}
    return httpx.post(base + "/v1/embeddings", json=body, headers=headers, timeout=timeout)


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return body


class _HealthProbe:
    """Polls /health from another thread (its own connection each time) and keeps the slowest answer."""

    def __init__(self, base: str):
        self.base, self.worst, self._stop = base, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        for _ in range(2000):  # bounded
            if self._stop.is_set():
                return
            started = time.monotonic()
            httpx.get(self.base + "/health", timeout=30)
            self.worst = max(self.worst, time.monotonic() - started)
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=35)


def test_decompression_bombs_are_budgeted_per_request_and_decoded_one_at_a_time(hostile):
    base, pid = hostile
    bomb = data_uri(_bomb_png(), "image/png")  # 5000×5000: exactly the per-image pixel limit
    assert len(bomb) < 6000
    _post(base, {"model": "tiny-clip", "modality": "image", "input": [data_uri(RED, "image/png")]})
    before = peak_rss_mb(pid)
    started = time.monotonic()
    with _HealthProbe(base) as probe:
        response = _post(base, {"model": "tiny-clip", "modality": "image", "input": [bomb] * 30})
    elapsed = time.monotonic() - started
    error = _error(response, 413)
    assert error["code"] == "media_budget_exceeded" and "input[8]" in error["message"], error
    grown = peak_rss_mb(pid) - before
    # 30 held at once took +5.2 GB; one at a time the peak is one image's decode and preprocessing
    assert grown < 900, f"peak RSS grew by {grown:.0f} MB"
    assert elapsed < 20, elapsed
    assert probe.worst < 1.0, f"/health took {probe.worst:.2f}s meanwhile"
    # the worst allowed request: 8 such images, exactly the default budget of 200M pixels
    started, before = time.monotonic(), peak_rss_mb(pid)
    ok = _post(base, {"model": "tiny-clip", "modality": "image", "input": [bomb] * 8})
    assert ok.status_code == 200 and len(ok.json()["data"]) == 8
    print(f"\nworst allowed image request (8 x 5000x5000): {time.monotonic() - started:.2f}s, server peak RSS "
          f"{peak_rss_mb(pid):.0f} MB, idle {before:.0f} MB (30 refused at the 9th: {elapsed:.2f}s, +{grown:.0f} MB)")


@pytest.mark.parametrize("rate", [2**31 - 1, 1_000_003, 999])
def test_implausible_sample_rates_are_refused_before_decoding(hostile, rate):
    base, pid = hostile
    started = time.monotonic()
    response = _post(base, {"model": "tiny-clap", "modality": "audio",
                            "input": [data_uri(_wav_header(rate), "audio/wav")]})
    error = _error(response, 400)
    assert "sample rate" in error["message"] and "input[0]" in error["message"]
    assert time.monotonic() - started < 2.0


def test_odd_but_plausible_rates_resample_fast(hostile):
    base, pid = hostile
    before = peak_rss_mb(pid)
    started = time.monotonic()
    response = _post(base, {"model": "tiny-clap", "modality": "audio",
                            "input": [data_uri(_wav_header(383_987, frames=383_987), "audio/wav")]})
    assert response.status_code == 200, response.text
    assert time.monotonic() - started < 3.0
    assert peak_rss_mb(pid) - before < 300


def test_audio_is_budgeted_per_request(hostile):
    base, pid = hostile
    import numpy as np

    from tests.multimodal.media_support import audio_bytes

    silence = audio_bytes(np.zeros(8000 * 290, np.float32), 8000, "FLAC")  # 290 s (per-item limit: 300 s)
    assert len(silence) < 200_000
    clip = data_uri(silence, "audio/flac")
    response = _post(base, {"model": "tiny-clap", "modality": "audio", "input": [clip] * 5})
    error = _error(response, 413)
    assert error["code"] == "media_budget_exceeded" and "input[4]" in error["message"]
    started, before = time.monotonic(), peak_rss_mb(pid)  # the worst allowed: 4 x 290 s = 1160 s
    ok = _post(base, {"model": "tiny-clap", "modality": "audio", "input": [clip] * 4})
    assert ok.status_code == 200 and len(ok.json()["data"]) == 4
    print(f"\nworst allowed audio request (4 x 290 s, 8 kHz -> 48 kHz): {time.monotonic() - started:.2f}s, "
          f"server peak RSS {peak_rss_mb(pid):.0f} MB (before: {before:.0f} MB)")


def test_slow_header_servers_hold_no_thread_and_hit_the_fetch_limit(hostile, media_server):
    """Two URLs whose server sends its headers a byte every 0.2 s (minutes in all) are fetched on the
    event loop: a valid request meanwhile is served at once, and the slow ones end at the 10 s limit."""
    base, _ = hostile
    slow = media_server.add("/loris.png", Route(RED, "image/png", header_dribble_s=0.2))
    results: dict[str, httpx.Response] = {}

    def send(key, body, **kw):
        results[key] = _post(base, body, **kw)

    slow_threads = [threading.Thread(target=send, args=(f"slow{i}", {"model": "tiny-clip", "modality": "image",
                                                                       "input": [slow]})) for i in range(2)]
    started = time.monotonic()
    for thread in slow_threads:
        thread.start()
    time.sleep(0.5)
    valid_started = time.monotonic()
    valid = _post(base, {"model": "tiny-clip", "modality": "image", "input": [data_uri(RED, "image/png")]},
                  timeout_header=5)
    valid_elapsed = time.monotonic() - valid_started
    assert valid.status_code == 200, valid.text
    assert valid_elapsed < 2.0, f"a valid request waited {valid_elapsed:.1f}s behind slow media servers"
    for thread in slow_threads:
        thread.join(timeout=60)
    for i in range(2):
        error = _error(results[f"slow{i}"], 400)
        assert "fetching took longer than 10s" in error["message"]
    assert time.monotonic() - started < 10 + 3


def test_a_slow_header_server_never_outlives_the_deadline(hostile, media_server):
    base, _ = hostile
    slow = media_server.add("/loris-deadline.png", Route(RED, "image/png", header_dribble_s=0.2))
    started = time.monotonic()
    response = _post(base, {"model": "tiny-clip", "modality": "image", "input": [slow, slow]}, timeout_header=1.0)
    _error(response, 504)
    assert time.monotonic() - started < 1.0 + 0.7


def test_the_deadline_stops_work_between_items(hostile):
    """Work whose deadline passed is abandoned at the next item, not after the whole request."""
    base, _ = hostile
    bomb = data_uri(_bomb_png(4000), "image/png")
    started = time.monotonic()
    response = _post(base, {"model": "tiny-clip", "modality": "image", "input": [bomb] * 12}, timeout_header=0.5)
    _error(response, 504)
    assert time.monotonic() - started < 0.5 + 1.0
