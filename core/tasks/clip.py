"""CLIP-family image–text embeddings: ``get_text_features`` / ``get_image_features`` (projected into one
space), L2-normalized by default so a text–image dot product is CLIP's cosine similarity."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from core.tasks.multimodal import MediaItem, MultiModalEmbedTask


class ClipTask(MultiModalEmbedTask):
    name: ClassVar[str] = "clip"
    head: ClassVar[str] = "towers"
    modalities: ClassVar[tuple[str, ...]] = ("text", "image")

    def image_items(self, images: list) -> list[MediaItem]:
        if not images:
            return []
        pixels = self.processor.image_processor(images, return_tensors="np")["pixel_values"].astype(np.float32)
        patches = self._patches(pixels.shape[-2:])
        return [MediaItem("image", {"pixel_values": np.ascontiguousarray(p)}, patches) for p in pixels]

    def _patches(self, hw) -> int:
        vision = self.info.config.get("vision_config") or {}
        patch = int(vision.get("patch_size") or 16)
        return (int(hw[0]) // patch) * (int(hw[1]) // patch) + 1  # + the class token
