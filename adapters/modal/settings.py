"""The Modal app's deploy-time settings (the table in ``adapters/modal/app.py``): parsed once, from the
environment given, by ``modal_settings``; and the refusal of API keys in that environment without a
named Modal Secret, which ``scripts/deploy.py`` applies too. Imports neither ``modal`` nor ``core``:
the deploy machine and the dry run need neither, and the image ships this file beside ``core``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

MODELS_DIR = "/models"  # where the Volume is mounted
DEFAULT_MODEL = "all-MiniLM-L6-v2"
HF_HOME = f"{MODELS_DIR}/huggingface"  # the Hugging Face cache, on the Volume: Hub ids serve offline from it
#: concurrent inputs per front end when TESSERA_MODAL_MAX_INPUTS is not set (the one-process class's default)
INPUTS_PER_FRONTEND = 64
#: Modal's highest ``@modal.concurrent(max_inputs=...)``
MODAL_MAX_INPUTS = 1000
#: the range of each numeric setting (``modal_settings`` refuses a value outside it, naming the variable):
#: Modal's own where it has one (``scaledown_window``: 2 to 3600 s), else far beyond any real deployment
BOUNDS: dict[str, tuple[float, float]] = {
    "volume_version": (1, 2),
    "scaledown_s": (2, 3600),
    "min_containers": (0, 1000),
    "max_containers": (1, 1000),
    "max_inputs": (1, MODAL_MAX_INPUTS),
    "target_inputs": (1, MODAL_MAX_INPUTS),
    "frontends": (1, 64),
    "cpu": (0.125, 64),
    "port": (1, 65_535),
}


@dataclass(frozen=True)
class ModalSettings:
    app_name: str
    gpus: list[str]  # first choice first
    volume_name: str
    volume_version: int
    scaledown_s: int
    min_containers: int
    max_containers: int
    max_inputs: int | None  # None: derived from the front ends (``limits``)
    target_inputs: int | None
    frontends: int | str  # a number, or "auto" (sized by the app file from ``cpu``: core.frontends)
    cpu: float | None  # cores reserved per container (``cpu=``), None: Modal's default (a fraction of one)
    port: int  # the port the front ends listen on inside the container (``@modal.web_server``)
    snapshot: bool
    secret_name: str  # "" for none
    proxy_auth: bool
    models: str  # TESSERA_MODELS, as JSON

    def container_env(self) -> dict[str, str]:
        """What the containers see besides the Secret (they parse the same variables when they import
        the app file)."""
        return {
            "TESSERA_MODELS": self.models,
            "TESSERA_MODAL_GPU": ",".join(self.gpus),
            "TESSERA_MODAL_VOLUME": self.volume_name,
            "TESSERA_MODAL_VOLUME_VERSION": str(self.volume_version),
            "TESSERA_MODAL_MAX_INPUTS": "" if self.max_inputs is None else str(self.max_inputs),
            "TESSERA_MODAL_TARGET_INPUTS": "" if self.target_inputs is None else str(self.target_inputs),
            "TESSERA_MODAL_FRONTENDS": str(self.frontends),
            "TESSERA_MODAL_CPU": "" if self.cpu is None else repr(self.cpu),
            "TESSERA_MODAL_PORT": str(self.port),
            "TESSERA_MODAL_SECRET": self.secret_name,
            "TESSERA_MODAL_PROXY_AUTH": "1" if self.proxy_auth else "0",
            "HF_HOME": HF_HOME,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }


    @property
    def planning_cpus(self) -> int:
        """The cores ``frontends: auto`` is sized for: the reserved ``cpu`` (whole cores), 1 when none is reserved."""
        return max(1, int(self.cpu or 1))

    def limits(self, frontends: int) -> tuple[int, int]:
        """``@modal.concurrent``'s (max_inputs, target_inputs) for a container with ``frontends`` front ends: the
        values set, else :data:`INPUTS_PER_FRONTEND` per front end (at most Modal's 1,000) and a target of 3/4
        of the cap (a new container starts before every slot is busy)."""
        cap = self.max_inputs or min(MODAL_MAX_INPUTS, INPUTS_PER_FRONTEND * max(1, frontends))
        target = self.target_inputs or max(1, cap * 3 // 4)
        return cap, min(target, cap)

    def volume_models(self) -> list[tuple[str, str, str, list[str] | None]]:
        """The models served from the Volume: (the spec's path, the folder on the Volume to list, the entry
        it must hold ("" for any), the ``seed_volume`` arguments that put it there, or None when only
        ``modal volume put`` can). A folder under /models must hold its ``config.json``; a Hub id is read
        from the Volume's Hugging Face cache (``HF_HOME``): a snapshot of it must be there."""
        found = []
        for spec in json.loads(self.models):
            path = str(spec.get("path", "")) if isinstance(spec, dict) else str(spec)
            if path.startswith(MODELS_DIR + "/"):
                name = path[len(MODELS_DIR) + 1:].strip("/")
                found.append((path, name, "config.json", [] if name == DEFAULT_MODEL else None))
            elif not path.startswith("/") and path.count("/") == 1:  # a Hub id: org/name
                seed = ["--model", path]
                if isinstance(spec, dict) and spec.get("backend"):
                    seed += ["--backend", str(spec["backend"])]
                found.append((path, f"huggingface/hub/models--{path.replace('/', '--')}/snapshots", "", seed))
        return found


def public_endpoint_problem(settings: ModalSettings) -> str | None:
    """Why the endpoint would be public with no key check (no Modal Secret to carry API keys, no proxy auth),
    or None. Modal web endpoints are public URLs; the Lambda template refuses the same (PublicUrlNeedsApiKeys)."""
    if settings.secret_name or settings.proxy_auth:
        return None
    return ("the endpoint would be a public URL with no key check: name a Modal Secret holding TESSERA_API_KEYS "
            "(modal secret create tessera-keys TESSERA_API_KEYS='[\"<a long random key>\"]', then "
            "TESSERA_MODAL_SECRET=tessera-keys), or set TESSERA_MODAL_PROXY_AUTH=1 (Modal-Key/Modal-Secret "
            "headers), or pass --allow-public to deploy it open on purpose")


def _number(environ: Mapping[str, str], field: str, default: str | None, kind: type = int):
    """The variable of ``field`` (``TESSERA_MODAL_<FIELD>``, ``TESSERA_MODAL_SCALEDOWN_S``), as ``kind``, inside
    ``BOUNDS``; ``None`` when unset and ``default`` is None. ValueError naming the variable otherwise."""
    name = "TESSERA_MODAL_" + {"volume_version": "VOLUME_VERSION"}.get(field, field.upper())
    text = (environ.get(name) or default or "").strip()
    if not text:
        return None
    low, high = BOUNDS[field]
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:  # (NaN too)
        what = "a whole number" if kind is int else "a number"
        raise ValueError(f"{name}={text!r}: expected {what} from {low:g} to {high:g}")
    return value


def modal_settings(environ: Mapping[str, str]) -> ModalSettings:
    """The ``TESSERA_MODAL_*`` variables and ``TESSERA_MODELS`` of ``environ``, with their defaults; a value
    out of its range (``BOUNDS``) is a ValueError naming its variable."""
    frontends = (environ.get("TESSERA_MODAL_FRONTENDS") or "auto").strip().lower()
    if frontends != "auto":
        frontends = _number({"TESSERA_MODAL_FRONTENDS": frontends}, "frontends", None)
    default_models = [{"path": f"{MODELS_DIR}/{DEFAULT_MODEL}", "name": DEFAULT_MODEL, "device": "cuda",
                       "dtype": "float16"}]
    return ModalSettings(
        app_name=environ.get("TESSERA_MODAL_APP", "tessera"),
        gpus=[g.strip() for g in environ.get("TESSERA_MODAL_GPU", "L4,A10G,T4").split(",") if g.strip()],
        volume_name=environ.get("TESSERA_MODAL_VOLUME", "tessera-models"),
        volume_version=_number(environ, "volume_version", "2"),
        scaledown_s=_number(environ, "scaledown_s", "300"),
        min_containers=_number(environ, "min_containers", "0"),
        max_containers=_number(environ, "max_containers", "4"),
        max_inputs=_number(environ, "max_inputs", None),
        target_inputs=_number(environ, "target_inputs", None),
        frontends=frontends,
        cpu=_number(environ, "cpu", None, float),
        port=_number(environ, "port", "8000"),
        snapshot=environ.get("TESSERA_MODAL_SNAPSHOT", "1") == "1",
        secret_name=environ.get("TESSERA_MODAL_SECRET", ""),
        proxy_auth=environ.get("TESSERA_MODAL_PROXY_AUTH", "0") == "1",
        models=environ.get("TESSERA_MODELS") or json.dumps(default_models),
    )


def deploy_time_keys_problem(environ: Mapping[str, str]) -> str | None:
    """Why ``environ`` cannot deploy (API keys set, no Modal Secret named to carry them: the app never
    sends deploy-time keys), or None. The message never holds the keys."""
    if environ.get("TESSERA_API_KEYS") and not environ.get("TESSERA_MODAL_SECRET"):
        return ("TESSERA_API_KEYS is set, but the Modal app never sends deploy-time keys (they would be stored in "
                "the app's definition): put them in a Modal Secret and name it, e.g. modal secret create "
                "tessera-keys TESSERA_API_KEYS='[\"sk-...\"]' and TESSERA_MODAL_SECRET=tessera-keys")
    return None
