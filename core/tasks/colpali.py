"""ColPali document retrieval: multi-vector embeddings (one L2-normalized vector per token) for page
images and for queries, through the model's own ``ColPaliProcessor`` (``process_images`` /
``process_queries``: the visual prompt, the query prefix and augmentation tokens). Score a query
against a page with MaxSim: sum over query vectors of the best dot product with the page's vectors."""

from __future__ import annotations

from typing import ClassVar, Sequence

import numpy as np

from core.tasks.multimodal import MediaItem, MultiModalEmbedTask
from core.torch_thread import on_torch_thread

_KEEP = ("input_ids", "attention_mask", "token_type_ids", "pixel_values")


class ColPaliTask(MultiModalEmbedTask):
    name: ClassVar[str] = "colpali"
    head: ClassVar[str] = "colpali"
    modalities: ClassVar[tuple[str, ...]] = ("text", "image")
    multi_vector: ClassVar[bool] = True

    def _dimension(self, config: dict) -> int | None:
        return config.get("embedding_dim")

    def _max_length(self, config: dict) -> int:
        text = (config.get("vlm_config") or {}).get("text_config") or {}
        return int(min(text.get("max_position_embeddings") or 8192, self.spec.max_length or 10**6))

    @staticmethod
    def _split(batch, modality: str) -> list[MediaItem]:
        arrays = {k: np.asarray(batch[k]) for k in _KEEP if k in batch}  # CPU torch tensors → numpy
        n = arrays["input_ids"].shape[0]
        items = []
        for row in range(n):
            one = {k: np.ascontiguousarray(v[row]) for k, v in arrays.items()}
            sequences = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in one]
            mask = one["attention_mask"].astype(bool)
            for key in sequences:
                one[key] = one[key].astype(np.int64)[mask]  # drop the processor's padding: collate pads right
            if "pixel_values" in one:
                one["pixel_values"] = one["pixel_values"].astype(np.float32)
            length = int(one["input_ids"].shape[0])
            items.append(MediaItem(modality, one, length, length))
        return items

    def text_items(self, texts: Sequence[str], *, truncate: bool) -> list[MediaItem]:
        items = []
        for i, text in enumerate(texts):
            item = self._split(on_torch_thread(self.processor.process_queries, [text], return_tensors="pt"), "text")[0]
            if item.length > self.max_length:
                from core.errors import TooLarge

                raise TooLarge(f"input[{i}] has {item.length} tokens; the model's limit is {self.max_length}",
                               param="input")
            items.append(item)
        return items

    def image_items(self, images: list) -> list[MediaItem]:
        if not images:
            return []
        # "np" breaks its label masking; its torch tensors are built on the torch thread (core/torch_thread.py:
        # torch work on a preparing thread would start a second OpenMP team and slow every forward)
        return self._split(on_torch_thread(self.processor.process_images, images, return_tensors="pt"), "image")
