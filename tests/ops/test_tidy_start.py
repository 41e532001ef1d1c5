"""A tidy start of ``python -m core serve``: a port in use is reported before any model loads, Ctrl-C during
the first start's export stops it without a traceback, a bad log level is one line, the log has one format
from its first line (no progress bars, no dict reprs) and names the served model, the packaged model is
served as all-MiniLM-L6-v2, and each request is logged once, under ``python -m core serve`` and under
``uvicorn core.dev:app`` alike."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.server import ROOT, environ_without_settings, free_port, running_process

#: core.logs.TEXT_FORMAT: time level logger: message
LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: \S")


def _env(**extra: str) -> dict[str, str]:
    return {**environ_without_settings("OTEL_"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1", "TESSERA_THREADS": "2", "PYTHONPATH": str(ROOT), **extra}


def test_a_port_in_use_is_reported_before_any_model_loads(minilm_onnx_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "core", "serve", "--model", str(minilm_onnx_dir), "--port",
                               str(port)], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "--port" in done.stderr
    assert "loading model" not in done.stderr + done.stdout and "Traceback" not in done.stderr
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("level", ["verbose", "inf"])
def test_a_bad_log_level_is_one_line(level):
    done = subprocess.run([sys.executable, "-m", "core", "serve"], cwd=ROOT, env=_env(TESSERA_LOG_LEVEL=level),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "KeyError" not in done.stderr
    problems = [line for line in done.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and "log_level (env TESSERA_LOG_LEVEL): not a logging level" in problems[0]
    assert "critical | error | warning | info | debug | trace" in problems[0]


@pytest.mark.slow
def test_first_start_log_one_format_served_name_no_progress_bars_one_line_per_request(tmp_path):
    """The packaged model on a fresh export cache (the first start exports it), its output piped as a
    container's or a service manager's is: every line in the text format, the export lines naming the
    served name, the model served as all-MiniLM-L6-v2, and one access line per request."""
    port = free_port()
    env = _env(TESSERA_CACHE_DIR=str(tmp_path / "cache"))
    command = [sys.executable, "-m", "core", "serve", "--host", "127.0.0.1", "--port", str(port)]
    with running_process(command, env, port=port, timeout=300, name="tidy-first") as (base, _proc):
        assert [m["id"] for m in httpx.get(base + "/v1/models").json()["data"]] == ["all-MiniLM-L6-v2"]
        got = httpx.post(base + "/v1/embeddings", json={"input": ["one request"]}, timeout=60)
        assert got.status_code == 200 and got.json()["model"] == "all-MiniLM-L6-v2"
        request_id = got.headers["x-request-id"]
        _wait_for(lambda: request_id in _log(port, "tidy-first"))
    text = _log(port, "tidy-first")
    lines = text.splitlines()
    assert lines and all(LINE.match(line) for line in lines), [l for l in lines if not LINE.match(l)][:5]
    assert "\r" not in text and "it/s" not in text and "{'" not in text
    exports = [line for line in lines if "core.convert.export_cache" in line]
    assert exports and all("all-MiniLM-L6-v2: " in line for line in exports), exports
    assert not re.search(r"\bmodel: ", text)  # the packaged folder's name is never the served name
    assert sum(request_id in line for line in lines) == 1
    assert not any("uvicorn.access" in line or '"POST /v1/embeddings' in line for line in lines)


@pytest.mark.slow
def test_uvicorn_dev_app_logs_each_request_once_in_our_format(minilm_onnx_dir):
    port = free_port()
    env = _env(TESSERA_MODELS=str(minilm_onnx_dir))
    command = [sys.executable, "-m", "uvicorn", "core.dev:app", "--host", "127.0.0.1", "--port", str(port)]
    with running_process(command, env, port=port, name="tidy-dev") as (base, _proc):
        got = httpx.post(base + "/v1/embeddings", json={"input": ["one request"]}, timeout=60)
        assert got.status_code == 200
        request_id = got.headers["x-request-id"]
        _wait_for(lambda: request_id in _log(port, "tidy-dev"))
    lines = _log(port, "tidy-dev").splitlines()
    assert lines and all(LINE.match(line) for line in lines), [l for l in lines if not LINE.match(l)][:5]
    assert sum("/v1/embeddings" in line for line in lines) == 1  # tessera.access only, not uvicorn's too


@pytest.mark.slow
@pytest.mark.parametrize("command, doing", [("serve", "loading"), ("prepare", "preparing")])
def test_ctrl_c_during_the_first_start_export_stops_without_a_traceback(command, doing, tmp_path):
    port = free_port()
    log = tmp_path / "out.log"
    argv = ["serve", "--port", str(port)] if command == "serve" else ["prepare"]
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "core", *argv], cwd=ROOT,
                                env=_env(TESSERA_CACHE_DIR=str(tmp_path / "cache")), stdout=out,
                                stderr=subprocess.STDOUT, preexec_fn=_ctrl_c_as_from_a_terminal)
        try:
            _wait_for(lambda: "exporting the encoder head" in log.read_text() or proc.poll() is not None, 240)
            assert proc.poll() is None, log.read_text()
            proc.send_signal(signal.SIGINT)
            code = proc.wait(timeout=30)  # not the rest of the export
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert code == 130, text
    assert "Traceback" not in text and "KeyboardInterrupt" not in text
    assert text.rstrip().splitlines()[-1] == f"tessera: stopped while {doing} models (Ctrl-C)"


def _ctrl_c_as_from_a_terminal() -> None:
    """SIGINT at its default, as a terminal's Ctrl-C finds it: a shell that starts the tests in the background
    (``scripts/test &``) has them ignore SIGINT, which their children inherit and Python keeps."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _log(port: int, name: str) -> str:
    return (ROOT / ".venv" / f"test-{name}-{port}.log").read_text()


def _wait_for(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
