"""SageMaker's settings, and which models a container serves: ``TESSERA_MODELS``/``TESSERA_CONFIG`` when
set, else what the model tarball unpacked into ``/opt/ml/model`` (``SM_MODEL_DIR``) holds:

- ``tessera.yaml`` / ``tessera.yml`` / ``tessera.json``: full settings; relative model paths are
  taken relative to the model directory;
- a model folder itself (``config.json`` at the top): one model, served as ``TESSERA_MODEL_NAME`` or
  ``model``;
- one model folder per sub-directory: each served under its directory name.

``TESSERA_DEVICE`` (e.g. ``cuda``, set by Dockerfile.cuda) applies to discovered folders.
With nothing there, the embedded default model is served.

Two limits follow SageMaker's own: ``request_timeout_s`` defaults to 55 s, so that a request's deadline
(its 504) lands before InvokeEndpoint's 60 s limit on the container's answer; and in Batch Transform,
which sets ``SAGEMAKER_MAX_PAYLOAD_IN_MB`` to the largest body it sends (the job's ``MaxPayloadInMB``),
the request-body limit is raised to it, so that no mini-batch the job may send is refused with a 413
(and, with ``SAGEMAKER_BATCH=true``, the real-time 6 MB response guard is off, the deadline is 595 s,
inside the job's default 600 s invocation timeout, unless set, and a mini-batch may hold any number of records:
``MultiRecord`` packs as many as ``MaxPayloadInMB`` holds, tens of thousands of short ones).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Mapping

from pydantic import Field

from core.config import GIB, ModelSpec, Settings, settings_from_env
from core.errors import ConfigError

DEFAULT_MODEL_DIR = "/opt/ml/model"
CONFIG_NAMES = ("tessera.yaml", "tessera.yml", "tessera.json")
#: SageMaker's limit on a real-time endpoint's response (InvokeEndpoint): 6 MB
SAGEMAKER_MAX_RESPONSE_BYTES = 6 * 1024 * 1024
#: InvokeEndpoint: "A customer's model containers must respond to requests within 60 seconds"
SAGEMAKER_INVOCATION_TIMEOUT_S = 60.0
#: the request deadline's default: SageMaker's 60 s less time to send the 504 back
REQUEST_TIMEOUT_S = SAGEMAKER_INVOCATION_TIMEOUT_S - 5
#: Batch Transform's per-invocation timeout when the job sets none (ModelClientConfig.InvocationsTimeoutInSeconds)
BATCH_INVOCATION_TIMEOUT_S = 600.0
#: set by Batch Transform: the largest payload it sends to the container over HTTP, in MB
MAX_PAYLOAD_VARIABLE = "SAGEMAKER_MAX_PAYLOAD_IN_MB"
#: the most of it taken as the request-body limit: ``max_request_bytes``' own bound (Batch Transform's is 100)
MAX_PAYLOAD_MB = GIB // (1024 * 1024)
#: set by multi-container endpoints: the port to listen on
PORT_VARIABLE = "SAGEMAKER_BIND_TO_PORT"


class SageMakerSettings(Settings):
    """The core settings plus the container's own (``TESSERA_`` variables like every other option)."""

    device: str = Field(default="cpu", description="device of the model folders found in SM_MODEL_DIR")
    model_name: str | None = Field(default=None, description="served name of a lone model folder (default 'model')")
    sagemaker_route: str | None = Field(
        default=None, description="/invocations route when a request names none (default: the one served capability)")
    sagemaker_max_response_bytes: int = Field(
        default=SAGEMAKER_MAX_RESPONSE_BYTES, ge=0, le=4 * GIB,
        description="answer 413 instead of a response over this size (SageMaker refuses > 6 MB); 0: no guard")
    port: int = Field(default=8080, ge=1, le=65_535, description="port (SageMaker's SAGEMAKER_BIND_TO_PORT wins)")
    sagemaker_batch: bool = Field(
        default=False, description="a Batch Transform container (SageMaker's SAGEMAKER_BATCH=true sets it): a JSON "
        "Lines mini-batch of any record count is answered whole, in windows of max_items_per_request records")
    request_timeout_s: float = Field(
        default=REQUEST_TIMEOUT_S, gt=0, le=86_400, allow_inf_nan=False,
        description="deadline of a request (504 after); below InvokeEndpoint's 60 s, so the container answers first")


def discover(model_dir: Path, *, device: str, name: str | None) -> list[ModelSpec]:
    if not model_dir.is_dir():
        return []
    if (model_dir / "config.json").exists():
        return [ModelSpec(path=model_dir, name=name or "model", device=device)]
    return [ModelSpec(path=sub, name=sub.name, device=device)
            for sub in sorted(model_dir.iterdir()) if (sub / "config.json").exists()]


def _is_hub_id(spec: ModelSpec, model_dir: Path) -> bool:
    """A relative ``org/name`` that is no folder of the model archive: a Hugging Face Hub id, kept as it is."""
    from core.hub import hub_id_of

    return hub_id_of(spec.path) is not None and not (model_dir / spec.path).exists()


def _batch_payload(settings: SageMakerSettings, environ: Mapping[str, str]) -> SageMakerSettings:
    """Batch Transform (``SAGEMAKER_BATCH=true``): no real-time 6 MB response guard and a deadline inside the
    job's default 600 s invocation timeout instead of 55 s, unless set; and
    ``SAGEMAKER_MAX_PAYLOAD_IN_MB``: the request-body limit raised to it (never lowered)."""
    if environ.get("SAGEMAKER_BATCH", "").lower() == "true":
        settings = settings.model_copy(update={"sagemaker_batch": True})
        if "TESSERA_SAGEMAKER_MAX_RESPONSE_BYTES" not in environ:
            settings = settings.model_copy(update={"sagemaker_max_response_bytes": 0})
        if "TESSERA_REQUEST_TIMEOUT_S" not in environ:  # the job's invocation timeout, not InvokeEndpoint's 60 s
            settings = settings.model_copy(update={"request_timeout_s": BATCH_INVOCATION_TIMEOUT_S - 5})
    given = environ.get(MAX_PAYLOAD_VARIABLE, "").strip()
    if not given:
        return settings
    try:
        megabytes = float(given)
    except ValueError:
        megabytes = math.nan
    if not 0 <= megabytes <= MAX_PAYLOAD_MB:  # (NaN and infinities too)
        raise ConfigError([f"{MAX_PAYLOAD_VARIABLE}={given!r}: expected a number of MB, 0 to {MAX_PAYLOAD_MB}"])
    payload = int(megabytes * 1024 * 1024)
    if payload <= settings.max_request_bytes:
        return settings
    return settings.model_copy(update={"max_request_bytes": payload})


def _bound_port(text: str) -> int:
    """``SAGEMAKER_BIND_TO_PORT``'s port; ConfigError naming the variable when it is none."""
    port = text.strip()
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65_535):
        raise ConfigError([f"{PORT_VARIABLE}={text!r}: expected a port, 1 to 65535"])
    return int(port)


def sagemaker_settings(environ: Mapping[str, str]) -> SageMakerSettings:
    """The container's settings, built once from ``environ`` (the edge of ``serve``)."""
    return _batch_payload(_settings(environ), environ)


def _settings(environ: Mapping[str, str]) -> SageMakerSettings:
    model_dir = Path(environ.get("SM_MODEL_DIR", DEFAULT_MODEL_DIR))
    overrides = {}
    if environ.get(PORT_VARIABLE):  # multi-container endpoints choose the port
        overrides["port"] = _bound_port(environ[PORT_VARIABLE])
    if not environ.get("TESSERA_CONFIG"):
        for candidate in CONFIG_NAMES:
            if (model_dir / candidate).exists():
                settings = settings_from_env(environ, SageMakerSettings, config=str(model_dir / candidate), **overrides)
                specs = [s if s.path.is_absolute() or _is_hub_id(s, model_dir)
                         else s.model_copy(update={"path": model_dir / s.path}) for s in settings.models]
                return settings.model_copy(update={"models": specs})
    settings = settings_from_env(environ, SageMakerSettings, **overrides)
    if settings.models:
        return settings
    specs = discover(model_dir, device=settings.device, name=settings.model_name)
    return settings.model_copy(update={"models": specs}) if specs else settings
