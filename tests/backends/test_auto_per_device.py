"""`backend: auto` for every (folder layout × device) pair, and, for the devices the SageMaker images serve,
that the backend chosen is one the image installs with that device's runtime: a folder with an ONNX graph on
`device: cuda` must not reach a CPU-only onnxruntime, a `neuron/` folder must not be picked on a GPU, and a
Neuron device without compiled buckets is refused with the command that makes them."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from core.backends.ct2 import CT2Backend
from core.backends.registry import choose
from core.config import ModelSpec
from core.errors import InvalidInput
from tests.support.server import ROOT

#: the files each layout holds (choose() reads only which files exist)
LAYOUTS = {
    "torch": ["model.safetensors"],
    "onnx": ["onnx/model.onnx"],
    "torch+onnx": ["model.safetensors", "onnx/model.onnx"],  # export_onnx.py / package_model.py output, most Hub repos
    "ct2": ["ct2/model.bin"],
    "torch+ct2": ["model.safetensors", "ct2/model.bin"],  # package_model.py with --ct2
    "torch+neuron": ["model.safetensors", "neuron/manifest.json"],
    "all": ["model.safetensors", "onnx/model.onnx", "neuron/manifest.json"],  # one tarball for both images
}
REFUSED = "refused"
#: layout → the backend `auto` picks on cpu, cuda, neuron
EXPECTED = {
    "torch": ("torch", "torch", REFUSED),
    "onnx": ("onnx", "onnx", REFUSED),
    "torch+onnx": ("onnx", "onnx", REFUSED),
    "ct2": ("ct2", "ct2", REFUSED),
    "torch+ct2": ("ct2", "ct2", REFUSED),
    "torch+neuron": ("neuron", "torch", "neuron"),
    "all": ("neuron", "onnx", "neuron"),
}
DEVICES = ("cpu", "cuda", "neuron")


def _folder(root: Path, layout: str) -> Path:
    folder = root / layout
    for name in ["config.json", *LAYOUTS[layout]]:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("{}")
    return folder


def _choice(folder: Path, device: str) -> str:
    try:  # head=None: the export cache is not tried (it is for CPU torch folders; tested in test_auto_backend)
        return choose(ModelSpec(path=folder, name="m", device=device), auto_export=False).backend
    except InvalidInput as exc:
        assert "compile_neuron.py" in str(exc) and "neuron/manifest.json" in str(exc), exc
        return REFUSED


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_auto_per_layout_and_device(tmp_path, layout):
    folder = _folder(tmp_path, layout)
    assert tuple(_choice(folder, device) for device in DEVICES) == EXPECTED[layout]
    assert _choice(folder, "cuda:1") == EXPECTED[layout][1]


def _pins(requirements: str) -> set[str]:
    lines = (ROOT / "adapters/sagemaker" / requirements).read_text().splitlines()
    return {canonicalize_name(Requirement(line).name) for line in lines if line.strip() and not line.startswith("#")}


#: what each backend needs installed on each device (the CPU onnxruntime has no CUDAExecutionProvider)
RUNTIME = {("torch", "cuda"): "torch", ("onnx", "cuda"): "onnxruntime-gpu", ("neuron", "neuron"): "optimum-neuron"}
#: the SageMaker images: their device (TESSERA_DEVICE) and pinned requirements; the layouts they serve
IMAGES = {"Dockerfile.cuda": ("cuda", "requirements-cuda.txt"), "Dockerfile.neuron": ("neuron", "requirements-neuron.txt")}
SERVED = ("torch", "onnx", "torch+onnx", "torch+ct2", "torch+neuron", "all")


def test_without_ctranslate2_the_torch_weights_serve(tmp_path, monkeypatch):
    """Where ctranslate2 is not installed, a folder with torch weights beside ct2/ is served by torch; one
    with nothing else stays ct2 (its load names the [ct2] extra)."""
    monkeypatch.setattr(CT2Backend, "installed", classmethod(lambda cls: False))
    assert [_choice(_folder(tmp_path, "torch+ct2"), d) for d in ("cpu", "cuda")] == ["torch", "torch"]
    assert _choice(_folder(tmp_path, "ct2"), "cuda") == "ct2"


@pytest.mark.parametrize("dockerfile", sorted(IMAGES))
def test_each_sagemaker_image_runs_what_auto_picks_on_its_device(tmp_path, dockerfile, monkeypatch):
    device, requirements = IMAGES[dockerfile]
    assert f"TESSERA_DEVICE={device}" in (ROOT / "adapters/sagemaker" / dockerfile).read_text()
    pins = _pins(requirements)
    # choose() asks the ct2 backend whether ctranslate2 is installed: answer as the image would
    monkeypatch.setattr(CT2Backend, "installed", classmethod(lambda cls: "ctranslate2" in pins))
    for layout in SERVED:
        backend = _choice(_folder(tmp_path, layout), device)
        if backend == REFUSED:
            continue  # a clear refusal at load (/ping answers 503 with it), never a runtime that is absent
        assert RUNTIME[backend, device] in pins, f"{dockerfile}: {layout} → {backend} on {device}, not installed"
    if device == "cuda":
        assert "onnxruntime" not in pins  # the CPU build would shadow onnxruntime-gpu
