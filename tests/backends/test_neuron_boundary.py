"""The Neuron-specific edge: what happens without optimum-neuron (here), and the exact calls made to it.

Neuron hardware and neuronx-cc are not on these machines. Two kinds of checks:
- with optimum-neuron absent (the real state here): every entry point fails with MissingDependency
  naming the [neuron] extra, before writing anything; a failing Neuron model does not stop the others;
- with an API-shaped stand-in for ``optimum.neuron`` (``NeuronModelForFeatureExtraction``:
  ``from_pretrained(src, export=True, batch_size=, sequence_length=, ...)``, ``save_pretrained``,
  ``from_pretrained(folder)``, ``model(**tensors).last_hidden_state``) backed by fixed-shape ONNX, the
  compile script and the backend run end to end and the served vectors match sentence-transformers.
  The stand-in records the calls; it replaces the vendor library only, never our code under test.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from core.backends.buckets import Bucket, Manifest
from core.config import ModelSpec, Settings
from core.convert.neuron import compile_buckets, neuron_compile_kwargs
from core.engine import Engine, Registry
from core.errors import InvalidInput, MissingDependency
from core.tasks.embed import EmbedRequest
from tests.support.modules import load_script

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = Settings(threads=2)


def _optimum_neuron_installed() -> bool:
    try:
        return importlib.util.find_spec("optimum.neuron") is not None
    except ModuleNotFoundError:
        return False


absent_only = pytest.mark.skipif(_optimum_neuron_installed(),
                                 reason="optimum-neuron is installed: the missing-extra path cannot happen")


def test_compile_kwargs_follow_optimum_neuron_0_4():
    assert neuron_compile_kwargs(Bucket(8, 128)) == {
        "export": True, "batch_size": 8, "sequence_length": 128, "auto_cast": "matmul", "auto_cast_type": "bf16"}
    assert neuron_compile_kwargs(Bucket(1, 512), auto_cast=None) == {
        "export": True, "batch_size": 1, "sequence_length": 512}


@absent_only
def test_compile_without_optimum_names_the_extra_and_writes_nothing(minilm_dir, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(MissingDependency, match=r"pip install -e '\.\[neuron\]'"):
        compile_buckets(minilm_dir, out, batch_sizes=[1], sequence_lengths=[128])
    assert not out.exists()


@absent_only
def test_compile_script_without_optimum_exits_with_the_fix(minilm_dir, tmp_path):
    proc = subprocess.run([sys.executable, "scripts/compile_neuron.py", str(minilm_dir), str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "pip install -e '.[neuron]'" in proc.stderr
    assert not (tmp_path / "o").exists()


@absent_only
def test_neuron_model_fails_alone_with_the_fix(minilm_static_buckets_dir, minilm_dir):
    """A folder with neuron/manifest.json resolves to the neuron backend under `auto`; without the extra it
    fails that model only, naming the extra; the other model serves."""
    from core.backends.registry import resolve_name

    neuron_spec = ModelSpec(path=minilm_static_buckets_dir, name="on-neuron")
    assert resolve_name(neuron_spec) == "neuron"
    settings = Settings(threads=2, models=[neuron_spec, ModelSpec(path=minilm_dir, name="on-torch", backend="torch")])
    registry = Registry.from_settings(settings)
    assert list(registry.engines) == ["on-torch"]
    assert "pip install -e '.[neuron]'" in registry.failed["on-neuron"].error


def test_neuron_refuses_a_cuda_device(minilm_static_buckets_dir):
    with pytest.raises(InvalidInput, match="not a Neuron device"):
        Engine.load(ModelSpec(path=minilm_static_buckets_dir, backend="neuron", device="cuda"), SETTINGS)


# ---- the calls, through an API-shaped stand-in for optimum.neuron ---------------------------------

class _Output:
    def __init__(self, hidden):
        self.last_hidden_state = hidden


class FakeNeuronModelForFeatureExtraction:
    """optimum.neuron's class as Tessera uses it, backed by fixed-shape ONNX (shape-strict like Neuron)."""

    calls: list[tuple] = []

    def __init__(self, source=None, bucket=None, session=None):
        self._source, self._bucket, self._session = source, bucket, session

    @classmethod
    def from_pretrained(cls, path, **kwargs):
        cls.calls.append(("from_pretrained", Path(path).name, kwargs))
        if kwargs.get("export"):
            return cls(source=Path(path), bucket=Bucket(kwargs["batch_size"], kwargs["sequence_length"]))
        import onnxruntime as ort

        return cls(session=ort.InferenceSession(str(Path(path) / "model.onnx"), providers=["CPUExecutionProvider"]))

    def save_pretrained(self, out):
        from tests.support.static_onnx import export_static

        self.calls.append(("save_pretrained", Path(out).name, {}))
        export_static(self._source, Path(out), self._bucket)

    def __call__(self, **tensors):
        import torch

        feeds = {k: v.numpy() for k, v in tensors.items()}
        self.calls.append(("__call__", None, {k: tuple(v.shape) for k, v in feeds.items()}))
        (hidden,) = self._session.run(["last_hidden_state"], feeds)
        return _Output(torch.from_numpy(hidden))


@pytest.fixture
def fake_optimum_neuron(monkeypatch):
    optimum = types.ModuleType("optimum")
    neuron = types.ModuleType("optimum.neuron")
    neuron.NeuronModelForFeatureExtraction = FakeNeuronModelForFeatureExtraction
    optimum.neuron = neuron
    monkeypatch.setitem(sys.modules, "optimum", optimum)
    monkeypatch.setitem(sys.modules, "optimum.neuron", neuron)
    FakeNeuronModelForFeatureExtraction.calls = []
    return FakeNeuronModelForFeatureExtraction


def test_compile_and_serve_through_the_optimum_neuron_calls(fake_optimum_neuron, minilm_dir, tmp_path,
                                                            st_minilm, sentences):
    compile_neuron = load_script("compile_neuron")
    out = tmp_path / "neuron-minilm"
    assert compile_neuron.main([str(minilm_dir), str(out), "--batch-sizes", "1,2", "--sequence-lengths", "32"]) == 0
    compiles = [c for c in fake_optimum_neuron.calls if c[0] == "from_pretrained"]
    assert [c[2] for c in compiles] == [neuron_compile_kwargs(Bucket(1, 32)), neuron_compile_kwargs(Bucket(2, 32))]
    assert [c[1] for c in fake_optimum_neuron.calls if c[0] == "save_pretrained"] == ["b1_s32", "b2_s32"]
    manifest = Manifest.read(out / "neuron")
    assert manifest.buckets == [Bucket(1, 32), Bucket(2, 32)] and manifest.dtype == "bf16"

    fake_optimum_neuron.calls = []
    engine = Engine.load(ModelSpec(path=out), SETTINGS, warm_up=False)  # auto → neuron; calls counted below
    assert engine.backend.name == "neuron" and engine.task.info.max_length == 32
    assert sorted(c[1] for c in fake_optimum_neuron.calls) == ["b1_s32", "b2_s32"]  # every bucket loaded
    assert all(c[2] == {} for c in fake_optimum_neuron.calls)
    fake_optimum_neuron.calls = []
    got = engine.run_sync(EmbedRequest(texts=sentences[:5])).vectors
    shapes = [c[2]["input_ids"] for c in fake_optimum_neuron.calls]
    assert shapes == [(2, 32), (2, 32), (1, 32)]  # 5 items: split 2 + 2 + 1, each at its static shape
    original = st_minilm.max_seq_length
    st_minilm.max_seq_length = 32
    try:
        want = st_minilm.encode(sentences[:5])
    finally:
        st_minilm.max_seq_length = original
    assert np.min((got * want).sum(axis=1)) >= 0.9999
    shutil.rmtree(out)
