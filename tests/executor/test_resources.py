"""Resources: weights are loaded once per device (a front end's memory does not grow by them, the executor's
does not grow per front end), and after ``stop`` no process and no shared-memory segment is left, also when
a front end was killed without closing."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from core.config import ModelSpec, Settings
from core.executor import ExecutorSet, remote_registry
from core.tasks.embed import EmbedRequest
from tests.executor import clients
from tests.executor.conftest import alive, rss_kib, segments, settings_for, wait_for

SPAWN = multiprocessing.get_context("spawn")


def test_weights_live_in_the_executor_once(minilm_onnx_dir):
    weights_kib = (Path(minilm_onnx_dir) / "onnx" / "model.onnx").stat().st_size // 1024
    assert weights_kib > 50_000  # big enough to see in a process's RSS
    spec = {"path": minilm_onnx_dir, "name": "emb", "backend": "onnx"}
    executors = ExecutorSet.start(settings_for({**spec, "device": "cpu:0"}))
    try:
        (pid,) = executors.pids
        executor_before = rss_kib(pid)
        assert executor_before > weights_kib
        with ProcessPoolExecutor(1, mp_context=SPAWN) as pool:
            local = pool.submit(clients.front_end_memory, settings_for({**spec, "device": "cpu"}), None, "emb").result()
        with ProcessPoolExecutor(2, mp_context=SPAWN) as pool:
            remote = [pool.submit(clients.front_end_memory, executors.settings, executors.address, "emb")
                      for _ in range(2)]
            remote = [r.result() for r in remote]
        executor_after = rss_kib(pid)
    finally:
        executors.stop(timeout=10.0)
    # the measurement sees the weights where they are loaded …
    assert local["growth_kib"] > 0.8 * weights_kib, local
    # … and a front end grows by far less: tokenizer and config, no runtime that could hold weights
    for front_end in remote:
        assert front_end["shape"] == (1, 384)
        assert front_end["runtimes"] == [], front_end
        assert front_end["growth_kib"] < 0.3 * weights_kib, front_end
    # two front ends served: the executor still holds one copy
    assert executor_after - executor_before < 0.3 * weights_kib


def test_stop_drains_and_leaves_nothing_behind(minilm_onnx_dir):
    spec = {"path": minilm_onnx_dir, "name": "emb", "backend": "onnx", "device": "cpu:0,cpu:1"}
    executors = ExecutorSet.start(settings_for(spec))
    pids, run_dir, prefix = executors.pids, Path(executors.address), executors.shm_prefix
    assert len(pids) == 2 and all(alive(p) for p in pids)
    assert all(os.getpgid(p) == os.getpgid(0) for p in pids)  # in the supervisor's process group

    # a front end killed without closing leaves no segment: the arenas (two per executor connection) lose their
    # names as soon as the executor has mapped them, so the kernel frees them with the last process mapping them
    ready = SPAWN.Event()
    killed = SPAWN.Process(target=clients.connect_and_wait, args=(executors.settings, executors.address, ready))
    killed.start()
    try:
        assert ready.wait(60)
        assert segments(prefix) == []
        os.kill(killed.pid, signal.SIGKILL)
        killed.join(10)
        asyncio.run(wait_for(lambda: segments(prefix) == [], timeout=30))
    finally:
        if killed.is_alive():
            killed.kill()

    async def main():
        registry = remote_registry(executors.settings, executors.address)
        await registry.start()
        engine = registry.engines["emb"]
        texts = [f"text {i} " * 20 for i in range(16)]
        work = [asyncio.ensure_future(engine(EmbedRequest(texts=texts))) for _ in range(24)]
        # every request sent, and answers coming back (the executors hold the rest)
        await wait_for(lambda: sum(link.sent.get("emb", 0) for link in engine.links) == len(work)
                       and sum(t.done() for t in work) >= 1, step=0.005)
        assert sum(not t.done() for t in work) >= 4
        stopping = threading.Thread(target=executors.stop, args=(30.0,))
        stopping.start()  # SIGTERM: the executors finish what they hold before they exit
        results = await asyncio.gather(*work)
        await asyncio.to_thread(stopping.join)
        await registry.stop()
        return results

    results = asyncio.run(main())
    assert all(r.vectors.shape == (16, 384) and np.isfinite(r.vectors).all() for r in results)
    assert not any(alive(p) for p in pids)
    assert not run_dir.exists()
    assert segments(prefix) == []
    assert executors.check() is not None


def test_cpu_executors_share_the_threads(minilm_onnx_dir):
    """Two CPU executors on a 2-thread setting get one thread each (so one ONNX lane each); a single CPU executor
    keeps both (two lanes); a model's own ``threads`` wins."""
    from core.executor.client import read_address

    spec = {"path": minilm_onnx_dir, "name": "emb", "backend": "onnx"}

    def lanes(executors):
        described = read_address(executors.address)["executors"]
        return {device: entry["models"]["emb"]["backend"]["lanes"] for device, entry in described.items()}

    two = ExecutorSet.start(Settings(models=[ModelSpec(**spec, device="cpu:0,cpu:1")], threads=2))
    try:
        assert two.settings_for("cpu:0").threads == two.settings_for("cpu:1").threads == 1
        assert lanes(two) == {"cpu:0": 1, "cpu:1": 1}
    finally:
        two.stop(timeout=10.0)
    one = ExecutorSet.start(Settings(models=[ModelSpec(**spec, device="cpu:0")], threads=2))
    try:
        assert one.settings_for("cpu:0").threads == 2 and lanes(one) == {"cpu:0": 2}
    finally:
        one.stop(timeout=10.0)
    own = ExecutorSet.start(Settings(models=[ModelSpec(**spec, device="cpu:0,cpu:1", threads=2)], threads=2))
    try:
        assert lanes(own) == {"cpu:0": 2, "cpu:1": 2}
    finally:
        own.stop(timeout=10.0)
