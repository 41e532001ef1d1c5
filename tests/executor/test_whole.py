"""Tasks whose items are not token arrays (here CLIP: images and texts) run whole in the executor: the front
end fetches the media and sends the request once; the answer equals the in-process engine's."""

from __future__ import annotations

import asyncio

import numpy as np

from benchmarks.media import data_uri, png
from core.engine import Registry
from core.executor import ExecutorSet
from core.tasks.embed import EmbedRequest
from tests.executor.conftest import running, settings_for


def test_clip_runs_whole_in_the_executor(clip_dir):
    images = [data_uri(png(color=(255, 0, 0)), "image/png"), data_uri(png(color=(0, 0, 255), shape=None), "image/png")]
    requests = [lambda: EmbedRequest(modality="image", inputs=list(images)),
                lambda: EmbedRequest(texts=["a red circle", "blue"])]
    local = Registry.from_settings(settings_for({"path": clip_dir, "name": "clip", "device": "cpu"}))
    executors = ExecutorSet.start(settings_for({"path": clip_dir, "name": "clip", "device": "cpu:0"}))

    async def main():
        await local.start()
        try:
            async with running(executors.settings, executors.address) as registry:
                engine = registry.engines["clip"]
                assert engine.whole
                for make in requests:
                    remote, reference = await engine(make()), await local.engines["clip"](make())
                    assert remote.prompt_tokens == reference.prompt_tokens
                    np.testing.assert_allclose(remote.vectors, reference.vectors, atol=1e-5)
                assert {link.device: link.sent for link in engine.links} == {"cpu:0": {"clip": 2}}
        finally:
            await local.stop()

    try:
        asyncio.run(main())
    finally:
        executors.stop(timeout=10.0)
