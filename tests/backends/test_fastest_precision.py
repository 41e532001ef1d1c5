"""`backend: auto` on an accelerator: `device: auto`, the candidates on CUDA, the parity gate, the timing, and
the stored measurement. The measurement itself runs here for real on the CPU (the same code that runs on a
GPU, with CPU candidates); the CUDA routing is checked with the measuring step replaced, since no GPU is here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.backends import precision, registry
from core.backends.precision import Candidate, Verdict, fastest
from core.backends.registry import choose, load_candidate
from core.config import ModelSpec
from core.devices import _TORCH_CUDA, auto_device

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def measured_once(minilm_dir, tmp_path_factory):
    """The packaged MiniLM measured on the CPU: float32 (kept), bfloat16, and int8 (dynamic quantization,
    worst cosine ~0.98 against float32: refused by the gate)."""
    cache = tmp_path_factory.mktemp("choices-cache")
    spec = ModelSpec(path=minilm_dir, device="cpu")
    candidates = [Candidate("torch", "float32"), Candidate("torch", "bfloat16"), Candidate("torch", "int8")]
    loaded = []

    def load(candidate):
        loaded.append(candidate.label)
        return load_candidate(spec, candidate, "encoder", 2)

    verdict = fastest(spec, "encoder", candidates, load=load, cache_dir=cache)
    return spec, candidates, cache, verdict, loaded


def test_the_gate_refuses_a_candidate_that_loses_parity_and_the_fastest_kept_serves(measured_once):
    spec, candidates, cache, verdict, loaded = measured_once
    assert loaded[0] == "torch:float32"  # the reference first, then every candidate once
    assert sorted(loaded[1:]) == sorted(c.label for c in candidates)
    stored = json.loads(next((cache / "choices").glob("*.json")).read_text())
    rows = {m["label"]: m for m in stored["measured"]}
    assert rows["torch:float32"]["kept"] and rows["torch:float32"]["worst_cosine"] > 0.99999
    assert not rows["torch:int8"]["kept"] and rows["torch:int8"]["worst_cosine"] < 0.9999
    assert "parity: worst cosine" in rows["torch:int8"]["why"] and rows["torch:int8"]["ms"] is None
    kept = {label: m["ms"] for label, m in rows.items() if m["kept"]}
    best = min(kept, key=kept.get)
    assert f"{verdict.backend}:{verdict.dtype}" == best and not verdict.fell_back
    assert "measured now" in verdict.reason and "torch:int8 refused" in verdict.reason
    assert stored["device_name"].startswith("cpu-") and stored["files"]["model.safetensors"]


def test_a_later_start_reuses_the_stored_measurement_without_loading_anything(measured_once):
    spec, candidates, cache, verdict, _ = measured_once

    def load(candidate):
        raise AssertionError(f"measured again: {candidate}")

    again = fastest(spec, "encoder", candidates, load=load, cache_dir=cache)
    assert (again.backend, again.dtype) == (verdict.backend, verdict.dtype)
    assert "measured at an earlier start" in again.reason


def test_no_candidate_kept_falls_back_to_float32(minilm_dir, tmp_path):
    spec = ModelSpec(path=minilm_dir, device="cpu")
    verdict = fastest(spec, "encoder", [Candidate("torch", "int8")],
                      load=lambda c: load_candidate(spec, c, "encoder", 2), cache_dir=tmp_path)
    assert (verdict.backend, verdict.dtype, verdict.fell_back) == ("torch", "float32", True)
    assert "no half-precision configuration kept parity" in verdict.reason


def test_a_candidate_that_fails_to_load_is_refused_with_its_error(minilm_dir, tmp_path):
    spec = ModelSpec(path=minilm_dir, device="cpu")
    # float16 is refused on CPU by the torch backend: a load error, reported, not fatal
    verdict = fastest(spec, "encoder", [Candidate("torch", "float16"), Candidate("torch", "float32")],
                      load=lambda c: load_candidate(spec, c, "encoder", 2), cache_dir=tmp_path)
    assert (verdict.backend, verdict.dtype) == ("torch", "float32")
    assert "torch:float16 refused (InvalidInput: float16 on CPU is not supported" in verdict.reason


@pytest.fixture
def recorded(monkeypatch):
    """``fastest`` replaced by a recorder (no GPU here); returns what choose passed it."""
    calls = []

    def record(spec, head, candidates, *, load, cache_dir, notes=None):
        calls.append({"spec": spec, "head": head, "candidates": candidates, "notes": notes})
        return Verdict("torch", "float16", "recorded")

    monkeypatch.setattr(precision, "fastest", record)
    return calls


def test_auto_on_cuda_with_no_dtype_measures_the_half_precisions(minilm_dir, tmp_path, recorded):
    choice = choose(ModelSpec(path=minilm_dir, device="cuda"), head="encoder", cache_dir=tmp_path)
    assert (choice.backend, choice.dtype, choice.reason) == ("torch", "float16", "recorded")
    (call,) = recorded
    labels = [c.label for c in call["candidates"]]
    assert labels[:2] == ["torch:float16", "torch:bfloat16"]
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        assert labels == ["torch:float16", "torch:bfloat16"]
        assert call["notes"] == ["onnxruntime has no CUDA provider (pip install onnxruntime-gpu)"]


def test_a_named_dtype_or_backend_on_cuda_is_not_measured(minilm_dir, tmp_path, recorded):
    named = choose(ModelSpec(path=minilm_dir, device="cuda", dtype="float32"), head="encoder", cache_dir=tmp_path)
    assert (named.backend, named.dtype) == ("torch", None) and "dtype float32" in named.reason
    explicit = choose(ModelSpec(path=minilm_dir, device="cuda", backend="torch"), head="encoder", cache_dir=tmp_path)
    assert explicit.reason == "set in the model spec"
    assert recorded == []


def test_device_auto_without_a_gpu_is_the_cpu(tmp_path, monkeypatch):
    assert ModelSpec(path=tmp_path).device == auto_device({})  # the default, resolved when the spec is read
    monkeypatch.setattr("core.devices.torch_is_cuda_build", lambda: True)
    assert auto_device({}, root=tmp_path) == "cpu"  # no driver entry
    gpus = tmp_path / "proc" / "driver" / "nvidia" / "gpus" / "0000:3b:00.0"
    gpus.mkdir(parents=True)
    assert auto_device({}, root=tmp_path) == "cuda"
    assert auto_device({"CUDA_VISIBLE_DEVICES": ""}, root=tmp_path) == "cpu"
    assert auto_device({"CUDA_VISIBLE_DEVICES": "-1"}, root=tmp_path) == "cpu"
    monkeypatch.setattr("core.devices.torch_is_cuda_build", lambda: False)  # a CPU build of torch, or none
    assert auto_device({}, root=tmp_path) == "cpu"


@pytest.mark.parametrize("text, cuda", [
    ("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n", False),
    ("__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\n", True),
    ("cuda = '12.1'\n", True),
    ("hip: Optional[str] = '6.2'\ncuda: Optional[str] = None\n", False),
])
def test_a_cuda_build_of_torch_is_told_from_its_version_file(text, cuda):
    assert (_TORCH_CUDA.search(text) is not None) is cuda


def test_the_installed_torch_here_is_read_without_importing_it():
    import subprocess
    import sys

    code = ("import sys; from core.devices import torch_is_cuda_build; r = torch_is_cuda_build(); "
            "print(r, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(registry.__file__).parents[2]).stdout.split()
    import torch

    assert out == [str(torch.version.cuda is not None), "False"]


def test_cuda_forwards_leave_cudnn_attention_out():
    """torch builds a cuDNN attention graph per new input shape (0.05-1 s each on an H200): on CUDA the torch
    backend runs attention with the flash / memory-efficient / math kernels only; on a CPU it changes nothing."""
    import torch

    from core.backends.torch import attention_kernels

    assert attention_kernels(torch, "cpu") is None
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with attention_kernels(torch, "cuda:0")():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
