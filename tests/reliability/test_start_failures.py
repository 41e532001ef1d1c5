"""A start that cannot serve as configured fails, on every entry point, within seconds, with the reason as the
last line of its error output: ``python -m core serve``, ``uvicorn core.dev:app``, SageMaker's ``serve`` and
the Modal class's enter hooks (Modal's own lookup of them, in a process of their own), each a real process.
A file of API keys that is missing or holds no key is such a reason (it once left a server that answered 500
on every route, or one with no authentication at all), and so is a setting out of its range. A start-up that
fails inside the app's lifespan, or while its middleware is built, stops uvicorn too (``lifespan="auto"``
once took the latter for an app without a lifespan and served plain-text 500s)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.server import ROOT, environ_without_settings, free_port

#: seconds an entry point may take to refuse its settings (imports included, on a loaded 2-core machine)
REFUSED_WITHIN_S = 60
MODAL_HOOKS = r"""
import importlib.util, sys
from modal._partial_function import _find_callables_for_obj
from modal._partial_function import _PartialFunctionFlags as Flags

spec = importlib.util.spec_from_file_location("tessera_modal_app", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
obj = module.Tessera._get_user_cls()()
for flag in (Flags.ENTER_PRE_SNAPSHOT, Flags.ENTER_POST_SNAPSHOT):  # the order Modal's container runs them in
    for hook in _find_callables_for_obj(obj, flag).values():
        hook()
print("started")
"""


def _command(entry: str, port: int) -> tuple[list[str], Path]:
    if entry == "core-serve":
        return [sys.executable, "-m", "core", "serve"], ROOT
    if entry == "uvicorn-core.dev":
        return [sys.executable, "-m", "uvicorn", "core.dev:app", "--host", "127.0.0.1", "--port", str(port)], ROOT
    if entry == "sagemaker-serve":
        return [sys.executable, str(ROOT / "adapters" / "sagemaker" / "serve")], Path("/")
    return [sys.executable, "-c", MODAL_HOOKS, str(ROOT / "adapters" / "modal" / "app.py")], ROOT


def _start(entry: str, model_dir: Path, tmp_path: Path, **settings: str) -> tuple[int | None, list[str], float]:
    """Run ``entry`` with ``settings``; (exit status or None when it was still running, stderr's lines, seconds)."""
    port = free_port()
    env = environ_without_settings("SAGEMAKER_", "SM_")
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(ROOT), HOME=str(tmp_path),
               TESSERA_HOST="127.0.0.1", TESSERA_PORT=str(port), SAGEMAKER_BIND_TO_PORT=str(port),
               SM_MODEL_DIR=str(tmp_path / "no-model-dir"), TESSERA_CACHE_DIR=str(tmp_path / "cache"),
               TESSERA_MODELS=json.dumps([{"path": str(model_dir), "name": "m", "backend": "onnx", "device": "cpu"}]))
    env.update(settings)
    cmd, cwd = _command(entry, port)
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=REFUSED_WITHIN_S)
    except subprocess.TimeoutExpired as still:
        stderr = still.stderr.decode(errors="replace") if isinstance(still.stderr, bytes) else (still.stderr or "")
        return None, stderr.strip().splitlines(), time.monotonic() - started
    return done.returncode, done.stderr.strip().splitlines(), time.monotonic() - started


ENTRY_POINTS = ("core-serve", "uvicorn-core.dev", "sagemaker-serve", "modal-enter")


@pytest.fixture
def blank_keys(tmp_path) -> Path:
    path = tmp_path / "keys.txt"
    path.write_text("  \n\n\t\n")
    return path


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("case", ["missing key file", "blank key file", "port out of range"])
def test_an_unusable_setting_fails_the_start_in_one_line(entry, case, minilm_onnx_dir, tmp_path, blank_keys):
    setting, value, reason = {
        "missing key file": ("TESSERA_API_KEYS_FILE", "/nonexistent", "/nonexistent: no such file"),
        "blank key file": ("TESSERA_API_KEYS_FILE", str(blank_keys), "holds no API key"),
        "port out of range": ("TESSERA_PORT", "99999", "less than or equal to 65535"),
    }[case]
    if entry == "sagemaker-serve" and setting == "TESSERA_PORT":
        setting = "SAGEMAKER_BIND_TO_PORT"  # SageMaker's variable wins over TESSERA_PORT
        reason = "expected a port, 1 to 65535"
    code, lines, took = _start(entry, minilm_onnx_dir, tmp_path, **{setting: value})
    assert code is not None, f"{entry}: still running after {REFUSED_WITHIN_S} s: {lines[-5:]}"
    assert code != 0, (entry, lines[-5:])
    assert lines, entry
    last = lines[-1]
    name = setting.removeprefix("TESSERA_").lower()
    assert (setting in last or name in last) and reason in last, (entry, lines[-5:])
    if entry != "modal-enter":  # (Modal shows the hook's exception: a short traceback ending in the one line)
        assert not any("Traceback" in line for line in lines), (entry, lines)


def test_a_start_up_that_fails_in_the_lifespan_exits_with_its_reason(tmp_path):
    """``uvicorn core.dev:app`` (uvicorn's own ``lifespan="auto"``) with a model that cannot load: uvicorn exits,
    and the reason is one line of the log, not Starlette's traceback."""
    code, lines, _took = _start("uvicorn-core.dev", tmp_path / "no-such-model", tmp_path)
    assert code is not None and code != 0, lines[-5:]
    assert not any("Traceback" in line for line in lines), lines
    (reason,) = [line for line in lines if "start-up failed: no model could be loaded" in line]
    assert "no-such-model" in reason


def _serve_briefly(app, lifespan: str, seconds: float = 30.0) -> tuple[bool, int | None]:
    """A real uvicorn server for ``app`` on loopback, stopped after ``seconds``; (it started serving, the
    status /health answered while it did)."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan=lifespan, log_level="error"))
    status: list[int] = []

    def probe() -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not server.should_exit:
            if server.started:
                status.append(httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code)
                break
            time.sleep(0.05)
        server.should_exit = True

    watcher = threading.Thread(target=probe, daemon=True)
    watcher.start()
    try:
        asyncio.run(server.serve())
    except SystemExit as stopped:  # uvicorn's own exit on a failed start-up (status 3)
        assert stopped.code != 0
    finally:
        server.should_exit = True
        watcher.join(seconds + 15)
    return server.started, status[0] if status else None


@pytest.mark.parametrize("lifespan", ["auto", "on"])
def test_a_middleware_that_cannot_be_built_fails_the_lifespan(lifespan, minilm_onnx_dir, tmp_path):
    """The keys file emptied after the settings were read: the app cannot be built with the keys it was given,
    so the server never serves (it used to serve 500 on every route, /health included, under "auto")."""
    from core.api.app import create_app
    from core.config import Settings

    keys = tmp_path / "keys.txt"
    keys.write_text("sk-one\n")
    settings = Settings(models=[{"path": str(minilm_onnx_dir), "name": "m", "backend": "onnx"}],
                        api_keys_file=keys)
    keys.write_text("\n")
    app = create_app(settings)
    started, health = _serve_briefly(app, lifespan)
    assert not started and health is None, (started, health)
    assert "api_keys_file" in app.state.startup_failure and "holds no API key" in app.state.startup_failure


RUN_UVICORN = r"""
import json, sys
from pathlib import Path
from core.api.app import create_app
from core.cli import run_uvicorn
from core.config import Settings

keys = Path(sys.argv[1])
keys.write_text("sk-one\n")
settings = Settings(models=json.loads(sys.argv[2]), api_keys_file=keys)
keys.write_text("\n")  # emptied after the settings were read: the app cannot be built with its keys
sys.exit(run_uvicorn(create_app(settings), host="127.0.0.1", port=int(sys.argv[3]), log_level="info"))
"""


def test_core_serve_prints_a_failed_start_up_last_and_exits_1(minilm_onnx_dir, tmp_path):
    """``python -m core serve``'s and SageMaker's ``serve``'s uvicorn (core.cli.run_uvicorn): the lifespan is
    required, and the reason of a failed start-up is the last line, after uvicorn's own."""
    models = json.dumps([{"path": str(minilm_onnx_dir), "name": "m", "backend": "onnx"}])
    env = {**environ_without_settings(), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", RUN_UVICORN, str(tmp_path / "keys"), models, str(free_port())],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=REFUSED_WITHIN_S)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, lines[-5:]
    assert lines[-1].startswith("tessera: start-up failed: invalid configuration: api_keys_file"), lines[-5:]
    assert "holds no API key" in lines[-1] and not any("Traceback" in line for line in lines), lines
