"""Batches never mix groups (modalities); a text-only model refuses media with its modalities named."""

from __future__ import annotations

import asyncio

import pytest

from core.batching import Batcher
from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import InvalidInput
from core.tasks.embed import EmbedRequest


def test_batcher_keeps_groups_apart_and_serves_the_oldest_group_first():
    batches: list[list[str]] = []

    def run(items):
        batches.append(list(items))
        return [f"done:{it}" for it in items]

    async def main():
        batcher = Batcher(run, max_batch_tokens=10_000, max_batch_size=64, max_queue_items=1000)
        await batcher.start()
        try:
            # the first request runs alone at once; the rest queue behind it and coalesce per group
            jobs = [batcher.submit([f"{g}{i}"], costs=[5], group=g) for i, g in enumerate("tittiitti")]
            return await asyncio.gather(*jobs)
        finally:
            await batcher.stop()

    results = asyncio.run(main())
    assert [r[0] for r in results] == [f"done:{g}{i}" for i, g in enumerate("tittiitti")]
    assert all(len({item[0] for item in batch}) == 1 for batch in batches)  # one group per batch
    assert len(batches) < 9  # and they did coalesce
    assert batches[1][0] == "i1"  # after the first batch, the oldest waiting group goes next


def test_text_model_refuses_media_naming_its_modalities(minilm_dir):
    engine = Engine.load(ModelSpec(path=minilm_dir), Settings(models=[]))
    assert engine.describe()["modalities"] == ["text"]
    with pytest.raises(InvalidInput) as err:
        engine.run_sync(EmbedRequest(modality="image", inputs=["http://169.254.169.254/"]))
    assert err.value.status == 400 and err.value.param == "modality"
    assert "modalities: ['text']" in err.value.message
