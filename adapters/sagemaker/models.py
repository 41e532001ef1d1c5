"""SageMaker's settings, and which models a container serves: ``TESSERA_MODELS``/``TESSERA_CONFIG`` when
set, else what the model tarball unpacked into ``/opt/ml/model`` (``SM_MODEL_DIR``) holds:

- ``tessera.yaml`` / ``tessera.yml`` / ``tessera.json``: full settings; relative model paths are
  taken relative to the model directory;
- a model folder itself (``config.json`` at the top): one model, served as ``TESSERA_MODEL_NAME`` or
  ``model``;
- one model folder per sub-directory: each served under its directory name.

``TESSERA_DEVICE`` (e.g. ``cuda``, set by Dockerfile.cuda) applies to discovered folders.
With nothing there, the embedded default model is served.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

from pydantic import Field

from core.config import ModelSpec, Settings, settings_from_env

DEFAULT_MODEL_DIR = "/opt/ml/model"
CONFIG_NAMES = ("tessera.yaml", "tessera.yml", "tessera.json")
#: SageMaker's limit on a real-time endpoint's response (InvokeEndpoint): 6 MB
SAGEMAKER_MAX_RESPONSE_BYTES = 6 * 1024 * 1024


class SageMakerSettings(Settings):
    """The core settings plus the container's own (``TESSERA_`` variables like every other option)."""

    device: str = Field(default="cpu", description="device of the model folders found in SM_MODEL_DIR")
    model_name: str | None = Field(default=None, description="served name of a lone model folder (default 'model')")
    sagemaker_route: str | None = Field(
        default=None, description="/invocations route when a request names none (default: the one served capability)")
    sagemaker_max_response_bytes: int = Field(
        default=SAGEMAKER_MAX_RESPONSE_BYTES, ge=0,
        description="answer 413 instead of a response over this size (SageMaker refuses > 6 MB); 0: no guard")
    port: int = Field(default=8080, description="port (SageMaker's SAGEMAKER_BIND_TO_PORT wins)")


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


def sagemaker_settings(environ: Mapping[str, str]) -> SageMakerSettings:
    """The container's settings, built once from ``environ`` (the edge of ``serve``)."""
    model_dir = Path(environ.get("SM_MODEL_DIR", DEFAULT_MODEL_DIR))
    overrides = {}
    if environ.get("SAGEMAKER_BIND_TO_PORT"):  # multi-container endpoints choose the port
        overrides["port"] = int(environ["SAGEMAKER_BIND_TO_PORT"])
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
