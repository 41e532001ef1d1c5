"""The process's one torch thread (core/torch_thread.py): every CPU load and forward of the torch backend
runs on it, whichever thread asks, so the process keeps a single OpenMP team."""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from core.torch_thread import is_torch_thread, on_torch_thread


def test_calls_from_any_thread_run_on_one_thread_and_return_or_raise_there():
    callers = [threading.get_ident()]
    with ThreadPoolExecutor(3) as pool:
        callers += [pool.submit(threading.get_ident).result() for _ in range(3)]
        ran_on = {on_torch_thread(threading.get_ident)}
        ran_on |= set(pool.map(lambda _: on_torch_thread(threading.get_ident), range(8)))
    assert len(ran_on) == 1 and not ran_on & set(callers)
    assert not is_torch_thread() and on_torch_thread(is_torch_thread)

    def fail():
        raise ValueError("from the torch thread")

    with pytest.raises(ValueError, match="from the torch thread"):
        on_torch_thread(fail)
    # a call made on the torch thread runs in place (no deadlock waiting on itself)
    assert on_torch_thread(lambda: on_torch_thread(threading.get_ident)) == ran_on.pop()


def _child_answer(queue) -> None:
    queue.put(on_torch_thread(lambda: 6 * 7))


def test_a_forked_child_gets_a_torch_thread_of_its_own():
    on_torch_thread(threading.get_ident)  # the parent's thread exists before the fork
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_answer, args=(queue,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == 42


def test_the_torch_backend_loads_and_runs_cpu_models_on_the_torch_thread(clip_dir, monkeypatch):
    from core.backends.torch import TorchBackend
    from core.config import ModelSpec, Settings
    from core.engine import Engine

    loaded_on = []
    original = TorchBackend._load

    def recording_load(self, *args, **kwargs):
        loaded_on.append(is_torch_thread())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TorchBackend, "_load", recording_load)
    spec = ModelSpec(path=clip_dir, name="clip", backend="torch", device="cpu")
    engine = Engine.load(spec, Settings(models=[]), warm_up=False)
    assert loaded_on == [True]

    forwards_on = set()
    # get_text_features/get_image_features call the towers, not CLIPModel.forward: hook the towers
    for tower in (engine.backend._eager.text_model, engine.backend._eager.vision_model):
        tower.register_forward_pre_hook(lambda *_: forwards_on.add(threading.get_ident()))
    (item,) = engine.task.text_items(["a photo of a cat"], truncate=True)
    inputs = engine.task.collate([item])
    with ThreadPoolExecutor(2) as pool:
        results = [pool.submit(engine.backend.run, inputs).result() for _ in range(2)]
    here = engine.backend.run(inputs)
    assert forwards_on == {on_torch_thread(threading.get_ident)}
    for out in results:
        np.testing.assert_array_equal(out["embeddings"], here["embeddings"])


def test_colpali_builds_its_processor_tensors_on_the_torch_thread(colpali_dir):
    """ColPali's processor returns torch tensors (its label masking needs them); building them on a preparing
    thread would start a second OpenMP team there."""
    from PIL import Image

    from core.config import ModelSpec
    from core.loading import read_model_info
    from core.tasks import create_task

    task = create_task("colpali", read_model_info(colpali_dir), ModelSpec(path=colpali_dir))
    seen = []
    for name in ("process_images", "process_queries"):
        original = getattr(task.processor, name)

        def recording(*args, _original=original, **kwargs):
            seen.append(is_torch_thread())
            return _original(*args, **kwargs)

        setattr(task.processor, name, recording)
    with ThreadPoolExecutor(1) as pool:
        images = pool.submit(task.image_items, [Image.new("RGB", (64, 48), (90, 120, 150))]).result()
        queries = pool.submit(task.text_items, ["a chart of sales"], truncate=True).result()
    assert seen == [True, True]
    assert images[0].modality == "image" and queries[0].modality == "text"
