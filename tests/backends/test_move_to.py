"""``Registry.move_to``: models loaded on one device (the CPU, before a memory snapshot) move to another with
their weights, not loaded again; each engine is built again around the moved backend with the spec it now
serves; a backend that binds its weights to a device, or a refused move, becomes a failed model."""

from __future__ import annotations

import numpy as np
import pytest

from core.config import ModelSpec, Settings
from core.engine import Registry
from core.tasks.embed import EmbedRequest

pytestmark = pytest.mark.slow


@pytest.fixture
def loaded(minilm_dir, minilm_onnx_dir):
    settings = Settings(models=[ModelSpec(path=minilm_dir, name="t", backend="torch", device="cpu"),
                                ModelSpec(path=minilm_onnx_dir, name="o", backend="onnx", device="cpu")], threads=2)
    registry = Registry.from_settings(settings, warm_up=False)
    assert sorted(registry.engines) == ["o", "t"]
    return settings, registry


def _vectors(engine, texts):
    return np.asarray(engine.run_sync(EmbedRequest(texts=texts)).vectors, dtype=np.float32)


def test_moved_weights_serve_with_the_new_spec(loaded, sentences):
    settings, registry = loaded
    before = registry.engines["t"]
    want = _vectors(before, sentences)
    target = before.spec.model_copy(update={"dtype": "bfloat16", "max_batch_tokens": 1024})
    moved = registry.move_to(settings=settings, specs={"t": target})
    assert sorted(moved.engines) == ["t"] and not moved.failed  # models not named are left out
    engine = moved.engines["t"]
    assert engine is not before and engine.backend is before.backend  # the same weights, cast in place
    assert engine.spec == target and engine.spec.batch_tokens == 1024
    assert engine.backend.describe()["dtype"] == "bfloat16"
    got = _vectors(engine, sentences)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() > 0.99


def test_backends_that_cannot_move_and_refused_moves_fail_the_model(loaded):
    import torch

    from core.engine import FailedModel

    settings, registry = loaded
    registry.failed["gone"] = FailedModel(ModelSpec(path="/nowhere", name="gone", device="cpu"), "did not load")
    moved = registry.move_to("cuda:0", settings=settings) if not torch.cuda.is_available() else None
    if moved is None:
        pytest.skip("this machine has CUDA: the refusal of a move to it is not seen here")
    assert not moved.engines
    assert "cannot move a loaded model to 'cuda:0'" in moved.failed["o"].error  # ONNX Runtime binds at load
    assert "CUDA is not available" in moved.failed["t"].error  # the torch backend's load rules
    assert moved.failed["gone"].error == "did not load"
    assert moved.failed["t"].spec.device == "cuda:0"


def test_a_move_to_the_same_device_rebuilds_the_engines_only(loaded):
    settings, registry = loaded
    moved = registry.move_to("cpu", settings=settings)
    assert sorted(moved.engines) == ["o", "t"]
    for name, engine in moved.engines.items():
        assert engine.backend is registry.engines[name].backend and engine.spec == registry.engines[name].spec
    with pytest.raises(ValueError, match="not both"):
        registry.move_to("cpu", settings=settings, specs={})
    with pytest.raises(KeyError, match="no model 'x'"):
        registry.move_to(settings=settings, specs={"x": registry.engines["t"].spec})
