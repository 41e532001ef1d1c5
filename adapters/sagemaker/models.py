"""Which models a SageMaker container serves: ``TESSERA_MODELS``/``TESSERA_CONFIG`` when set, else
what the model tarball unpacked into ``/opt/ml/model`` (``SM_MODEL_DIR``) holds:

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

from core.config import ModelSpec, Settings

DEFAULT_MODEL_DIR = "/opt/ml/model"
CONFIG_NAMES = ("tessera.yaml", "tessera.yml", "tessera.json")


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


def sagemaker_settings(environ: Mapping[str, str]) -> Settings:
    model_dir = Path(environ.get("SM_MODEL_DIR", DEFAULT_MODEL_DIR))
    if not environ.get("TESSERA_CONFIG"):
        for candidate in CONFIG_NAMES:
            if (model_dir / candidate).exists():
                settings = Settings(config=str(model_dir / candidate))
                specs = [s if s.path.is_absolute() or _is_hub_id(s, model_dir)
                         else s.model_copy(update={"path": model_dir / s.path}) for s in settings.models]
                return settings.model_copy(update={"models": specs})
    settings = Settings()
    if settings.models:
        return settings
    specs = discover(model_dir, device=environ.get("TESSERA_DEVICE", "cpu"), name=environ.get("TESSERA_MODEL_NAME"))
    return settings.model_copy(update={"models": specs}) if specs else settings
