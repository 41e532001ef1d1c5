"""An executor killed while it serves: its requests in flight fail with a 5xx in the error shape naming it,
the other executor's requests are unaffected, the registry is not ready until the supervisor restarted it
and the front end reconnected; then it serves again."""

from __future__ import annotations

import asyncio
import os
import signal

import numpy as np
import pytest

from core.errors import BackendFailure, NotReady, StartupFailed
from core.executor import ExecutorSet, remote_registry
from core.serving.models import readiness
from core.tasks.embed import EmbedRequest
from tests.executor.conftest import alive, settings_for, wait_for

TEXTS = [f"sentence number {i} about a cat that sat on a long and winding mat " * 3 for i in range(16)]


def test_a_killed_executor_fails_its_requests_only_and_comes_back(minilm_onnx_dir):
    spec = {"path": minilm_onnx_dir, "backend": "onnx"}
    executors = ExecutorSet.start(settings_for({**spec, "name": "a", "device": "cpu:0"},
                                               {**spec, "name": "b", "device": "cpu:1"}))
    victim = executors.executors["cpu:0"].process.pid

    async def main():
        registry = remote_registry(executors.settings, executors.address)
        await registry.start()
        a, b = registry.engines["a"], registry.engines["b"]
        try:
            reference = (await b(EmbedRequest(texts=TEXTS[:1]))).vectors[0]
            on_a = [asyncio.ensure_future(a(EmbedRequest(texts=TEXTS))) for _ in range(30)]
            on_b = [asyncio.ensure_future(b(EmbedRequest(texts=TEXTS))) for _ in range(10)]
            # kill it once it has answered something and holds more: a batch is running or about to
            await wait_for(lambda: sum(t.done() for t in on_a) >= 1)
            assert sum(not t.done() for t in on_a) >= 5
            os.kill(victim, signal.SIGKILL)
            outcomes = await asyncio.gather(*on_a, return_exceptions=True)
            failed = [o for o in outcomes if isinstance(o, Exception)]
            assert failed, "no request was in flight on the killed executor"
            for exc in failed:
                assert isinstance(exc, BackendFailure) and exc.status == 500
                assert "executor cpu:0" in exc.body()["error"]["message"]
            for served in outcomes:
                if not isinstance(served, Exception):
                    np.testing.assert_allclose(served.vectors[0], reference, atol=1e-4)
            for served in await asyncio.gather(*on_b):  # the other executor never noticed
                np.testing.assert_allclose(served.vectors[0], reference, atol=1e-4)

            await wait_for(lambda: not registry.ready)
            with pytest.raises(NotReady, match="executor cpu:0"):  # /ready's 503 names it
                readiness(registry, draining=False)
            assert "cpu:0" in executors.check() and "signal 9" in executors.check()
            with pytest.raises(NotReady, match="executor cpu:0"):
                await a(EmbedRequest(texts=["while it is down"]))
            assert registry.engines["b"].healthy

            assert await asyncio.to_thread(executors.restart) == ["cpu:0"]
            assert executors.check() is None and not alive(victim)
            await wait_for(lambda: registry.ready, timeout=30)
            again = await a(EmbedRequest(texts=TEXTS[:1]))
            np.testing.assert_allclose(again.vectors[0], reference, atol=1e-4)
        finally:
            await registry.stop()

    try:
        asyncio.run(main())
    finally:
        executors.stop(timeout=10.0)


def test_a_model_that_cannot_load_names_itself_and_its_device(tmp_path, minilm_onnx_dir):
    (tmp_path / "config.json").write_text("{}")
    settings = settings_for({"path": minilm_onnx_dir, "name": "good", "backend": "onnx", "device": "cpu:0"},
                            {"path": tmp_path, "name": "broken", "backend": "onnx", "device": "cpu:1"})
    with pytest.raises(StartupFailed, match=r"model 'broken' failed to load on cpu:1"):
        ExecutorSet.start(settings)
