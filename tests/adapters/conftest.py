"""Fixtures for the adapter tests: one model set-up (MiniLM tokenizer + the packaged int8 ONNX graph,
no torch in the serving path) behind every surface, each built once per session."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.adapters.contract import MODEL, Case, Reply
from tests.adapters.events import LambdaContext
from tests.support.modules import load_by_path
from tests.support.server import ROOT, environ_without_settings, free_port, running_process

LAMBDA_HANDLER = ROOT / "adapters" / "lambda" / "handler.py"
MODAL_APP = ROOT / "adapters" / "modal" / "app.py"
SERVE = ROOT / "adapters" / "sagemaker" / "serve"


def int8_spec(minilm_dir: Path, onnx_file: Path) -> dict:
    return {"path": str(minilm_dir), "name": MODEL, "backend": "onnx", "dtype": "int8", "onnx_file": str(onnx_file)}


@pytest.fixture(scope="session")
def reference(st_minilm):
    """fp32 sentence-transformers vectors (normalized), cached per text."""
    cache: dict[str, np.ndarray] = {}

    def embed(texts: list[str]) -> np.ndarray:
        missing = [t for t in texts if t not in cache]
        if missing:
            for text, vec in zip(missing, st_minilm.encode(missing, normalize_embeddings=True)):
                cache[text] = np.asarray(vec, np.float32)
        return np.stack([cache[t] for t in texts])

    return embed


def reply_from_asgi_client(response) -> Reply:
    return Reply(response.status_code, {k.lower(): v for k, v in response.headers.items()}, response.content)


def asgi_send(client):
    def send(case: Case) -> Reply:
        payload = case.payload()
        headers = {"content-type": "application/json"} if payload is not None else {}
        return reply_from_asgi_client(client.request(case.method, case.path, content=payload, headers=headers))

    return send


@pytest.fixture(scope="session")
def local_client(minilm_dir, packaged_int8_onnx):
    from starlette.testclient import TestClient

    from core.api.app import create_app
    from core.config import Settings

    settings = Settings(models=[int8_spec(minilm_dir, packaged_int8_onnx)])
    with TestClient(create_app(settings)) as client:
        yield client


@pytest.fixture(scope="session")
def lambda_module():
    """adapters/lambda/handler.py loaded by path with no configuration (the embedded default model)."""
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("TESSERA_")}
    os.environ["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] = "3008"
    try:
        module = load_by_path("tessera_lambda_handler", LAMBDA_HANDLER)
    finally:
        os.environ.pop("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", None)
        os.environ.update(saved)
    yield module
    module.loop.run_until_complete(module.registry.stop(drain=False))
    module.loop.close()


def invoke(module, event: dict) -> Reply:
    response = module.handler(event, LambdaContext())
    body = response.get("body") or ""
    raw = __import__("base64").b64decode(body) if response.get("isBase64Encoded") else body.encode()
    return Reply(response["statusCode"], {k.lower(): v for k, v in response.get("headers", {}).items()}, raw)


@pytest.fixture(scope="session")
def sagemaker_model_dir(tmp_path_factory, minilm_dir, packaged_int8_onnx) -> Path:
    """The layout of an unpacked model tarball: tessera.yaml + one model folder with its ONNX graph."""
    root = tmp_path_factory.mktemp("opt-ml-model")
    folder = root / MODEL
    (folder / "onnx").mkdir(parents=True)
    for item in minilm_dir.iterdir():
        if item.is_file():
            (folder / item.name).symlink_to(item)
    (folder / "onnx" / "model_int8.onnx").symlink_to(packaged_int8_onnx)
    (root / "tessera.yaml").write_text(f"models:\n  - path: {MODEL}\n    backend: onnx\n    dtype: int8\n")
    return root


@contextmanager
def sagemaker_process(model_dir: Path, extra_env: dict | None = None, timeout: float = 60.0):
    """``adapters/sagemaker/serve`` as SageMaker runs it, on 127.0.0.1:<free port>; yields (base, proc)."""
    port = free_port()
    env = environ_without_settings()
    env.update({"SM_MODEL_DIR": str(model_dir), "SAGEMAKER_BIND_TO_PORT": str(port), "TESSERA_HOST": "127.0.0.1",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **(extra_env or {})})
    with running_process([sys.executable, str(SERVE)], env, port=port, ready_path="/ping", cwd=Path("/"),
                         timeout=timeout, name="sagemaker") as (base, proc):
        yield base, proc


@pytest.fixture(scope="session")
def sagemaker_server(sagemaker_model_dir):
    with sagemaker_process(sagemaker_model_dir) as (base, proc):
        yield base


def sagemaker_send(base: str):
    """POST routes go through /invocations with SageMaker's headers; GET routes directly."""

    def send(case: Case) -> Reply:
        if case.method == "POST":
            route = case.path.removeprefix("/v1/")
            response = httpx.post(base + "/invocations", content=case.payload(), timeout=60, headers={
                "Content-Type": "application/json", "Accept": "application/json",
                "X-Amzn-SageMaker-Custom-Attributes": f"route={route}",
            })
        else:
            response = httpx.request(case.method, base + case.path, timeout=60)
        return Reply(response.status_code, {k.lower(): v for k, v in response.headers.items()}, response.content)

    return send


MODAL_ENV: dict[str, str] = {}


@contextmanager
def modal_env():
    """The operator's environment for adapters/modal/app.py, set only while the file or its hooks read it."""
    saved = {k: os.environ.get(k) for k in MODAL_ENV}
    os.environ.update(MODAL_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def modal_module(minilm_dir, packaged_int8_onnx):
    """adapters/modal/app.py loaded by path, configured for the CPU int8 model (as an operator would)."""
    MODAL_ENV.update({"TESSERA_MODELS": json.dumps([int8_spec(minilm_dir, packaged_int8_onnx)]),
                      "TESSERA_MODAL_GPU": "L40S,A100,L4", "TESSERA_MODAL_MAX_INPUTS": "32",
                      "TESSERA_MODAL_MIN_CONTAINERS": "1"})
    with modal_env():
        return load_by_path("tessera_modal_app", MODAL_APP)


def modal_hooks(obj, phase: str) -> list:
    """The enter hooks Modal's container runtime calls on ``obj`` in ``phase``, found by Modal's own
    lookup (``_find_callables_for_obj`` with the ENTER_PRE_SNAPSHOT / ENTER_POST_SNAPSHOT flags)."""
    from modal._partial_function import _find_callables_for_obj
    from modal._partial_function import _PartialFunctionFlags as Flags

    flag = {"snapshot": Flags.ENTER_PRE_SNAPSHOT, "restore": Flags.ENTER_POST_SNAPSHOT}[phase]
    return list(_find_callables_for_obj(obj, flag).values())


def modal_snapshot_phase(module):
    """A new instance of the user class with the hooks run before Modal takes the memory snapshot."""
    obj = module.Tessera._get_user_cls()()
    with modal_env():
        for hook in modal_hooks(obj, "snapshot"):
            hook()
    return obj


def modal_restore_phase(obj) -> None:
    """The hooks Modal runs after restoring a snapshot (and, without one, right after the first)."""
    with modal_env():
        for hook in modal_hooks(obj, "restore"):
            hook()


def modal_exit_phase(obj) -> None:
    """The exit hooks Modal runs when the container stops (``_PartialFunctionFlags.EXIT``)."""
    from modal._partial_function import _find_callables_for_obj
    from modal._partial_function import _PartialFunctionFlags as Flags

    for hook in _find_callables_for_obj(obj, Flags.EXIT).values():
        hook()


def modal_instance(module):
    """An instance of the user class with its enter hooks run, as Modal does in a container."""
    obj = modal_snapshot_phase(module)
    modal_restore_phase(obj)
    return obj, module.Tessera._get_partial_functions()


@pytest.fixture(scope="session")
def modal_client(modal_module):
    from starlette.testclient import TestClient

    obj, hooks = modal_instance(modal_module)
    app = hooks["web"]._get_raw_f()(obj)
    with TestClient(app) as client:
        yield client


def lambda_send(module, kind):
    from tests.adapters.events import EVENTS

    def send(case: Case) -> Reply:
        return invoke(module, EVENTS[kind](case.method, case.path, case.payload()))

    return send



