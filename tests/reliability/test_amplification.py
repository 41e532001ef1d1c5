"""One small request must not buy gigabytes, seconds of a frozen event loop or minutes of work: the
long-input features (chunking, late chunking), wide JSON, TEI's /embed_all and SageMaker's JSON Lines,
against real server processes on loopback. Each test measures the server process itself (its peak RSS
over the request, sampled from /proc, and the wall-clock time) while another process probes /health,
and prints the worst request the limits still allow (``-s`` shows the figures docs/reliability.md gives).

The servers run with ``max_tokens_per_request`` 32768 (an eighth of the default) so that the worst
allowed requests finish in seconds on a small machine; their cost grows linearly with that limit."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import pytest

from benchmarks.server import rss_mb
from tests.support.server import ROOT, environ_without_settings, free_port, running_process, uvicorn_command

MAX_TOKENS = 32768
#: /health's slowest answer while an allowed request runs off the event loop: generous, for a busy machine
#: (the paths these tests guard blocked it for 5-50 s; beside a CPU hog at load ~11 it stayed under 0.7 s)
HEALTH_WHILE_ALLOWED_S = 2.0

#: polls /health on its own connection until its stdin closes (at most ``argv[2]`` seconds); prints the
#: slowest answer in seconds
PROBE = r"""
import json, select, sys, time, httpx
base, limit = sys.argv[1], float(sys.argv[2])
worst, count, end = 0.0, 0, time.monotonic() + limit
with httpx.Client(timeout=120) as client:
    assert client.get(base + "/health").status_code == 200
    print("ready", flush=True)
    while time.monotonic() < end and not select.select([sys.stdin], [], [], 0.02)[0]:
        started = time.perf_counter()
        assert client.get(base + "/health").status_code == 200
        worst, count = max(worst, time.perf_counter() - started), count + 1
print(json.dumps({"worst": worst, "count": count}), flush=True)
"""


@dataclass
class Cost:
    seconds: float = 0.0
    rss_before_mb: float = 0.0
    peak_rss_mb: float = 0.0
    health_worst_s: float = 0.0

    @property
    def grown_mb(self) -> float:
        return self.peak_rss_mb - self.rss_before_mb

    def __str__(self) -> str:
        return (f"{self.seconds:.2f}s, server RSS {self.rss_before_mb:.0f} -> peak {self.peak_rss_mb:.0f} MB "
                f"(+{self.grown_mb:.0f}), /health worst {self.health_worst_s * 1000:.0f} ms")


@contextmanager
def measured(base: str, pid: int):
    """Time the block, sample the server's RSS every 10 ms, and probe /health from another process."""
    cost = Cost(rss_before_mb=rss_mb(pid))
    cost.peak_rss_mb = cost.rss_before_mb
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.01):
            cost.peak_rss_mb = max(cost.peak_rss_mb, rss_mb(pid))

    prober = subprocess.Popen([sys.executable, "-c", PROBE, base, "600"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    sampler = threading.Thread(target=sample, daemon=True)
    try:
        assert prober.stdout.readline().strip() == "ready"
        sampler.start()
        started = time.monotonic()
        yield cost
        cost.seconds = time.monotonic() - started
    finally:
        stop.set()
        out, _ = prober.communicate(timeout=180)  # closes its stdin: it stops and reports
        sampler.join(5)
    cost.peak_rss_mb = max(cost.peak_rss_mb, rss_mb(pid))
    cost.health_worst_s = json.loads(out.strip().splitlines()[-1])["worst"]


def _env(models: list[dict], port: int, **settings) -> dict[str, str]:
    env = environ_without_settings()
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TESSERA_PORT=str(port), TESSERA_HOST="127.0.0.1",
               TESSERA_MODELS=json.dumps(models), TESSERA_THREADS="2", TESSERA_ACCESS_LOG="false",
               TESSERA_MAX_TOKENS_PER_REQUEST=str(MAX_TOKENS))
    env.update({f"TESSERA_{k.upper()}": str(v) for k, v in settings.items()})
    return env


@pytest.fixture(scope="module")
def server(minilm_onnx_dir):
    """``uvicorn core.dev:app`` serving MiniLM (ONNX Runtime fp32), every other limit at its default."""
    port = free_port()
    env = _env([{"path": str(minilm_onnx_dir), "name": "m", "backend": "onnx"}], port)
    with running_process(uvicorn_command("core.dev:app", port), env, port=port, timeout=180,
                         name="amplification") as (base, proc):
        yield base, proc.pid


def _post(base: str, path: str, body, timeout: float = 300) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    return httpx.post(base + path, content=content, headers={"content-type": "application/json"}, timeout=timeout)


def _error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code, error
    return error


def _report(what: str, cost: Cost) -> None:
    print(f"\n{what}: {cost}")


def _refused_cheaply(cost: Cost, seconds: float = 3.0) -> None:
    assert cost.seconds < seconds, cost
    assert cost.grown_mb < 200, cost
    assert cost.health_worst_s < 1.0, cost


# ---- chunking -------------------------------------------------------------------------------------------

LONG_TEXT = "word " * 20_000  # 100,000 characters (max_chars_per_item), 20,000 tokens


def test_a_one_token_stride_is_refused_before_any_window_is_built(server):
    """{"chunking": {"size": 256, "overlap": 253}} over 100 KB built ~20,000 windows of 256 tokens before
    the tokens limit was checked: RSS past 4 GB, killed. The windows are counted from the token count."""
    base, pid = server
    with measured(base, pid) as cost:
        response = _post(base, "/v1/embeddings", {"model": "m", "input": [LONG_TEXT],
                                                  "chunking": {"size": 256, "overlap": 253}})
    error = _error(response, 413, "too_many_tokens")
    assert error["param"] == "chunking" and "windows" in error["message"]
    _refused_cheaply(cost)
    _report("chunking, 1-token stride over 100 KB (refused)", cost)
    # windows count as items: tiny windows that stay within the tokens limit are refused by their number
    with measured(base, pid) as cost:
        response = _post(base, "/v1/embeddings", {"model": "m", "input": [LONG_TEXT[:20_000]],
                                                  "chunking": {"size": 8, "overlap": 5}})
    _error(response, 413, "too_many_windows")
    _refused_cheaply(cost)


def test_the_worst_allowed_chunking_request(server):
    base, pid = server
    # 20,000 tokens in windows of 256 (254 text tokens) with a 156-token step: 128 windows, 32,702 tokens,
    # just within 32,768
    with measured(base, pid) as cost:
        response = _post(base, "/v1/embeddings", {"model": "m", "input": [LONG_TEXT],
                                                  "chunking": {"size": 256, "overlap": 98}})
    assert response.status_code == 200, response.text[:300]
    assert response.json()["usage"]["prompt_tokens"] <= MAX_TOKENS
    assert cost.health_worst_s < HEALTH_WHILE_ALLOWED_S, cost
    _report(f"worst allowed chunking request (1 text, {response.json()['usage']['prompt_tokens']} tokens in "
            "windows)", cost)


# ---- late chunking ---------------------------------------------------------------------------------------

def test_the_late_chunking_separator_counts_toward_the_limits(server):
    """1,000 chunks of "b" joined by a 10,000-character separator (a 15 KB body) made a ~10M-character
    context, tokenized on the event loop: /health blocked ~50 s, RSS 0.6 → 3.1 GB, 413 after 56 s."""
    base, pid = server
    body = {"model": "m", "input": ["b"] * 1000, "late_chunking": {"separator": "b " * 5000}}
    assert len(orjson.dumps(body)) < 16_000
    with measured(base, pid) as cost:
        response = _post(base, "/v1/embeddings", body)
    error = _error(response, 413)
    assert error["param"] == "late_chunking" and "separator" in error["message"]
    _refused_cheaply(cost, 2.0)
    _report("late chunking, 1,000 chunks + 10,000-char separator (refused)", cost)
    # a 10 KB body within the limits (a 50,006-character context): tokenized on a worker thread, not the loop
    body = {"model": "m", "input": ["b"] * 6, "late_chunking": {"separator": "b " * 5000}}
    with measured(base, pid) as cost:
        response = _post(base, "/v1/embeddings", body)
    assert response.status_code == 200, response.text[:300]
    assert cost.health_worst_s < HEALTH_WHILE_ALLOWED_S, cost


def test_the_worst_allowed_late_chunking_context(server):
    base, pid = server
    # a context of 64,032 characters and ~32,000 tokens (the tokens limit binds first here): 127 windows
    body = {"model": "m", "input": ["b " * 1_200] * 25, "late_chunking": {"separator": "b " * 84}}
    with measured(base, pid) as cost:
        response = _post(base, "/v1/embeddings", body)
    assert response.status_code == 200, response.text[:300]
    assert len(response.json()["data"]) == 25
    assert cost.health_worst_s < HEALTH_WHILE_ALLOWED_S, cost
    _report(f"worst allowed late-chunking context (64,032 characters, {response.json()['usage']['prompt_tokens']} "
            "tokens)", cost)


def test_late_chunking_spans_count_as_items(server):
    """One 950-character text with 150,000 spans (a 900 KB body): a 200 with a 710 MB answer after 8.9 s,
    /health stalled 5.5 s."""
    base, pid = server
    text = "word " * 190
    with measured(base, pid) as cost:
        response = _post(base, "/v1/embeddings", {"model": "m", "input": text,
                                                  "late_chunking": {"spans": [[0, 4]] * 150_000}})
    _error(response, 413, "too_many_values")  # more values than any request holds: refused before validation
    _refused_cheaply(cost, 2.0)
    _report("late chunking, 150,000 spans (refused)", cost)
    with measured(base, pid) as cost:
        response = _post(base, "/v1/embeddings", {"model": "m", "input": text,
                                                  "late_chunking": {"spans": [[0, 4]] * 2049}})
    error = _error(response, 413)
    assert error["param"] == "late_chunking.spans" and "2049" in error["message"]
    _refused_cheaply(cost, 2.0)
    with measured(base, pid) as cost:  # the worst allowed: max_items_per_request spans
        response = _post(base, "/v1/embeddings", {"model": "m", "input": text,
                                                  "late_chunking": {"spans": [[0, 4]] * 2048}})
    assert response.status_code == 200 and len(response.json()["data"]) == 2048
    assert cost.health_worst_s < HEALTH_WHILE_ALLOWED_S and cost.grown_mb < 500, cost
    _report(f"worst allowed spans request (2,048 spans, {len(response.content) / 1e6:.1f} MB answer)", cost)


# ---- wide JSON -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, key", [("/v1/embeddings", "input"), ("/decode", "ids")])
def test_wide_json_is_refused_before_it_is_parsed_on_the_event_loop(server, path, key):
    """{"input": [[]] * 2.6M} (7.8 MB) stalled the event loop 7.9 s before its 413; the same on /decode."""
    base, pid = server
    body = orjson.dumps({key: [[]] * 2_600_000})
    assert len(body) < 8 * 1024 * 1024
    with measured(base, pid) as cost:
        response = _post(base, path, body)
    _error(response, 413, "too_many_values")
    _refused_cheaply(cost, 2.0)
    assert cost.health_worst_s < 0.5, cost
    _report(f"wide JSON on {path}, 2.6M elements (refused)", cost)
    # the widest body let through to validation (just within the bound): answered quickly
    with measured(base, pid) as cost:
        response = _post(base, path, orjson.dumps({key: [[]] * 33_000}))
    assert response.status_code in (200, 413, 422), response.text[:300]
    assert cost.health_worst_s < HEALTH_WHILE_ALLOWED_S, cost
    _report(f"widest JSON validated on {path} (33,000 elements)", cost)


# ---- deep JSON -------------------------------------------------------------------------------------------

#: 8,000 lists nested 500 deep (8 MB, few commas, so no wide-JSON count saw it): 3.6 s of parsing on the event
#: loop (orjson, then FastAPI's json.loads again) and +704 MB before the validation error
DEEP = b'{"input": [' + b",".join([b"[" * 500 + b"]" * 500] * 8_000) + b"]}"
#: as many lists, 60 deep (within the depth bound): 480,000 lists, past any request's number of values
DEEP_WITHIN_DEPTH = b'{"input": [' + b",".join([b"[" * 60 + b"]" * 60] * 8_000) + b"]}"


def _post_at_once(base: str, path: str, body: bytes, times: int) -> list[httpx.Response]:
    answers: list[httpx.Response] = []
    senders = [threading.Thread(target=lambda: answers.append(_post(base, path, body))) for _ in range(times)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(300)
    return answers


@pytest.mark.parametrize("path", ["/v1/embeddings", "/embed"])
def test_deep_json_is_refused_before_it_is_parsed(server, path):
    base, pid = server
    assert len(DEEP) < 8 * 1024 * 1024 and DEEP.count(b",") < 10_000
    with measured(base, pid) as cost:
        response = _post(base, path, DEEP)
    error = _error(response, 400, "invalid_json")
    assert "64 levels" in error["message"]
    _refused_cheaply(cost, 2.0)
    assert cost.health_worst_s < 0.5, cost
    _report(f"deep JSON on {path}, 8,000 lists 500 deep (refused)", cost)
    with measured(base, pid) as cost:
        response = _post(base, path, DEEP_WITHIN_DEPTH)
    _error(response, 413, "too_many_values")
    _refused_cheaply(cost, 2.0)
    _report(f"deep JSON on {path}, 8,000 lists 60 deep (refused)", cost)


def test_four_deep_bodies_at_once_leave_health_answering(server):
    """Four deep 8 MB bodies at once blocked /health 8.6 s."""
    base, pid = server
    with measured(base, pid) as cost:
        answers = _post_at_once(base, "/v1/embeddings", DEEP, 4)
    assert len(answers) == 4
    for response in answers:
        _error(response, 400, "invalid_json")
    assert cost.health_worst_s < 1.0 and cost.grown_mb < 300, cost
    _report("four deep 8 MB bodies at once (refused)", cost)


def test_an_unterminated_string_of_escaped_quotes_is_measured_in_linear_time(server):
    """A body with an unterminated string of 34,000 escaped quotes and commas (100 KB, enough commas for the
    wide-JSON check to look): the regular expression that blanked its strings backtracked over the rest of
    the body from every quote (quadratic: about a minute holding the GIL). The byte scan is linear, and the
    parser refuses the body."""
    base, pid = server
    body = b'{"input": "' + b'\\",' * 34_000
    with measured(base, pid) as cost:
        response = _post(base, "/v1/embeddings", body)
    _error(response, 400, "invalid_json")
    _refused_cheaply(cost, 2.0)


#: texts full of what a structure count would count outside strings: brackets, braces, commas, quotes
#: (escaped), backslashes, digits, literals' letters and dots
BRACKETED = 'f(x) = [[{"a": [1, 2.5]}]], true\\ {[(, , , , ,' * 80


def test_brackets_commas_and_quotes_inside_strings_never_count(server):
    """A valid request whose texts hold ~48,000 brackets and 56,000 commas (raw counts far past both
    bounds): measured exactly, strings apart, and served."""
    base, pid = server
    body = orjson.dumps({"model": "m", "input": [BRACKETED + str(i) for i in range(100)]})
    assert body.count(b"[") + body.count(b"{") > 40_000 and body.count(b",") > 40_000
    with measured(base, pid) as cost:
        response = _post(base, "/v1/embeddings", body)
    assert response.status_code == 200, response.text[:300]
    assert len(response.json()["data"]) == 100
    assert cost.health_worst_s < HEALTH_WHILE_ALLOWED_S, cost
    nested = {"model": "m", "input": ["[" * 5000, "{" * 5000 + '"' + "]" * 100]}  # deep only inside strings
    assert _post(base, "/v1/embeddings", orjson.dumps(nested)).status_code == 200


# ---- TEI /embed_all --------------------------------------------------------------------------------------

def test_embed_all_is_bounded_by_the_response_limit(server):
    """32 KB of text answered 74 MB (~2,260x) after 32 s: refused before any inference."""
    base, pid = server
    body = {"inputs": ["a " * 254] * 64}  # 32 KB: 64 × 256 tokens, a vector of 384 per token
    assert len(orjson.dumps(body)) < 33_000
    with measured(base, pid) as cost:
        response = _post(base, "/embed_all", body)
    error = _error(response, 413, "response_too_large")
    assert "max_response_bytes" in error["message"]
    _refused_cheaply(cost, 2.0)
    _report("/embed_all, 32 KB of text (refused)", cost)
    with measured(base, pid) as cost:  # the worst allowed: 10,900 tokens × 384 values ≤ 32 MiB at 8 bytes a value
        response = _post(base, "/embed_all", {"inputs": ["a " * 254] * 42})
    assert response.status_code == 200, response.text[:300]
    assert cost.health_worst_s < HEALTH_WHILE_ALLOWED_S, cost
    _report(f"worst allowed /embed_all (42 x 256 tokens, {len(response.content) / 1e6:.1f} MB answer)", cost)


# ---- media ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def media(clip_dir, clap_dir):
    """``uvicorn core.dev:app`` serving the tiny CLIP (its processor scales the shortest side to 32, then crops)
    and CLAP folders, every media limit at its default."""
    port = free_port()
    env = _env([{"path": str(clip_dir), "name": "clip"}, {"path": str(clap_dir), "name": "clap"}], port)
    with running_process(uvicorn_command("core.dev:app", port), env, port=port, timeout=180,
                         name="amplification-media") as (base, proc):
        yield base, proc.pid


def _strip_png(width: int, height: int) -> str:
    """A 1-bit PNG data: URI of width x height pixels (a few hundred bytes at most)."""
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("1", (width, height)).save(buf, "PNG", optimize=True)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize("width, height", [(50_000, 1), (1, 50_000), (1_000_000, 1), (5_000, 20)])
def test_an_extreme_aspect_ratio_is_refused_before_it_is_resized(media, width, height):
    """An 86-byte 50000x1 PNG cost +487 MB (the processor scaled its one-pixel side to 32: 32 x 1.6M), a
    201-byte 1,000,000x1 one +1.6 GB and then a 500 (MemoryError)."""
    base, pid = media
    uri = _strip_png(width, height)
    assert len(uri) < 2_000
    with measured(base, pid) as cost:
        response = _post(base, "/v1/embeddings", {"model": "clip", "modality": "image", "input": [uri]})
    error = _error(response, 400, "invalid_media")
    assert "aspect ratio" in error["message"] and "input[0]" in error["message"]
    _refused_cheaply(cost, 2.0)
    assert cost.grown_mb < 100, cost
    _report(f"a {width}x{height} PNG of {len(uri)} characters (refused)", cost)


def test_the_widest_allowed_image_is_served(media):
    base, pid = media
    with measured(base, pid) as cost:  # 200:1, the bound: the processor makes it 6,400 x 32 before its crop
        response = _post(base, "/v1/embeddings", {"model": "clip", "modality": "image",
                                                  "input": [_strip_png(6_400, 32), _strip_png(32, 6_400)]})
    assert response.status_code == 200 and len(response.json()["data"]) == 2, response.text[:300]
    assert cost.grown_mb < 100, cost


def _silent_flac(rate: int, channels: int, seconds: int) -> str:
    import base64
    import io

    import numpy as np
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.zeros((rate * seconds, channels), dtype=np.int16), rate, format="FLAC", subtype="PCM_16")
    return "data:audio/flac;base64," + base64.b64encode(buf.getvalue()).decode()


def test_audio_is_bounded_by_the_samples_it_decodes_to(media):
    """A 400 KB silent FLAC of 299 s at 384 kHz decoded to 115M float32 samples (then downmixed and resampled
    to 48 kHz): refused from its header. The same duration in stereo at 48 kHz is the most that decodes."""
    base, pid = media
    uri = _silent_flac(384_000, 1, 299)
    assert len(uri) < 1_000_000
    with measured(base, pid) as cost:
        response = _post(base, "/v1/embeddings", {"model": "clap", "modality": "audio", "input": [uri]})
    error = _error(response, 400, "invalid_media")
    assert "samples" in error["message"]
    _refused_cheaply(cost, 3.0)
    assert cost.grown_mb < 150, cost
    _report("a 299 s 384 kHz silent FLAC (refused)", cost)
    with measured(base, pid) as cost:
        response = _post(base, "/v1/embeddings", {"model": "clap", "modality": "audio",
                                                  "input": [_silent_flac(48_000, 2, 299)]})
    assert response.status_code == 200, response.text[:300]
    _report("the most audio decoded: 299 s of stereo at 48 kHz", cost)


# ---- SageMaker JSON Lines --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sagemaker(minilm_onnx_dir):
    port = free_port()
    env = _env([{"path": str(minilm_onnx_dir), "name": "m", "backend": "onnx"}], port,
               max_inflight_requests=24)
    env.update(SAGEMAKER_BIND_TO_PORT=str(port), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(ROOT / "adapters" / "sagemaker" / "serve")]
    with running_process(cmd, env, port=port, ready_path="/ping", cwd=Path("/"), timeout=180,
                         name="amplification-sagemaker") as (base, proc):
        yield base, proc.pid


def _jsonl(base: str, records: list[dict]) -> httpx.Response:
    body = b"".join(orjson.dumps(r) + b"\n" for r in records)
    return httpx.post(base + "/invocations", content=body, timeout=300,
                      headers={"content-type": "application/jsonlines", "accept": "application/jsonlines",
                               "x-amzn-sagemaker-custom-attributes": "route=embeddings"})


def _items_embedded(base: str) -> float:
    text = httpx.get(base + "/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tessera_batch_size_sum"))


@pytest.mark.parametrize("content_type", ["application/json", "application/jsonlines"])
def test_deep_json_is_refused_by_invocations(sagemaker, content_type):
    """SageMaker's /invocations with the deep 8 MB body: 2.2 s and +732 MB before its error."""
    base, pid = sagemaker
    with measured(base, pid) as cost:
        response = httpx.post(base + "/invocations", content=DEEP, timeout=300,
                              headers={"content-type": content_type,
                                       "x-amzn-sagemaker-custom-attributes": "route=embeddings"})
    _error(response, 400, "invalid_json")
    _refused_cheaply(cost, 2.0)
    _report(f"deep JSON on /invocations ({content_type}, refused)", cost)
    brackets = _jsonl(base, [{"input": BRACKETED + str(i)} for i in range(100)])  # brackets in strings only
    assert brackets.status_code == 200 and brackets.headers["x-tessera-failed-records"] == "0", brackets.text[:300]


def test_json_lines_records_count_toward_the_item_limit(sagemaker):
    """20,000 records in a 280 KB body ran 185 s of inference on one in-flight slot, then a 413 threw it
    all away: now refused before any record runs."""
    base, pid = sagemaker
    before = _items_embedded(base)
    with measured(base, pid) as cost:
        response = _jsonl(base, [{"input": f"r {i}"} for i in range(20_000)])
    assert response.status_code == 413, response.text[:300]
    _refused_cheaply(cost, 3.0)
    assert _items_embedded(base) == before  # nothing ran
    _report("JSON Lines, 20,000 records (refused)", cost)


def test_a_json_lines_answer_that_cannot_fit_is_refused_before_the_work(sagemaker):
    base, pid = sagemaker
    before = _items_embedded(base)
    records = [{"input": [f"record {i}", "two"]} for i in range(1000)]  # 2,000 vectors of 384: ~9 MB > 6 MB
    with measured(base, pid) as cost:
        response = _jsonl(base, records)
    error = _error(response, 413, "response_too_large")
    assert "at least" in error["message"]
    assert _items_embedded(base) == before
    _refused_cheaply(cost, 3.0)
    with measured(base, pid) as cost:  # the worst allowed: 1,000 records of one input (~4.4 MB answer)
        response = _jsonl(base, [{"input": f"record {i}"} for i in range(1000)])
    assert response.status_code == 200 and len(response.content.splitlines()) == 1000
    assert cost.health_worst_s < HEALTH_WHILE_ALLOWED_S, cost
    _report(f"worst allowed JSON Lines mini-batch (1,000 records, {len(response.content) / 1e6:.1f} MB)", cost)


def test_json_lines_records_hold_in_flight_slots(sagemaker):
    """Each record runs as a request in flight: a mini-batch runs no more records at once than the
    in-flight cap leaves room for (24 here, below the 64 records it would run), and the gauge shows them."""
    base, pid = sagemaker
    records = [{"input": ["a long record that takes the model a while " * 8] * 16} for _ in range(32)]
    seen: list[float] = []
    done = threading.Event()
    result: list[httpx.Response] = []

    def send() -> None:
        try:
            result.append(_jsonl(base, records))
        finally:
            done.set()

    sender = threading.Thread(target=send)
    sender.start()
    for _ in range(20_000):  # bounded: until the mini-batch is answered
        if done.wait(0.01):
            break
        text = httpx.get(base + "/metrics", timeout=30).text
        seen += [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith("tessera_inflight_requests ")]
    sender.join(300)
    assert result and result[0].status_code == 200, result and result[0].text[:300]
    assert result[0].headers["x-tessera-failed-records"] == "0"
    assert max(seen) > 2, max(seen)  # the records, not just the one request that carried them
    assert max(seen) <= 24, max(seen)  # the cap holds, the carrying request included
