"""CLIP-family image–text embeddings: ``get_text_features`` / ``get_image_features`` (projected into one
space), L2-normalized by default so a text–image dot product is CLIP's cosine similarity.

SigLIP-style models (``model_type: siglip``) are served by the same task: their text tower pools the
*last* position, so text is padded to ``max_length`` the way the tokenizer pads (as SigLIP was trained).
SigLIP 2 (``Siglip2Model``, the NaFlex layout) too: its image processor cuts each image into at most
``max_num_patches`` patches at the image's own aspect ratio and adds ``pixel_attention_mask`` and
``spatial_shapes``, which travel with the pixels to the vision tower (every image has the same padded shape,
so images still share a batch). The fixed-resolution SigLIP 2 checkpoints are ``SiglipModel`` folders."""

from __future__ import annotations

from typing import ClassVar, Sequence

import numpy as np

from core.tasks.multimodal import MediaItem, MultiModalEmbedTask


class ClipTask(MultiModalEmbedTask):
    name: ClassVar[str] = "clip"
    head: ClassVar[str] = "towers"
    modalities: ClassVar[tuple[str, ...]] = ("text", "image")

    def __init__(self, info, spec):
        super().__init__(info, spec)
        self.pad_to_max_length = info.model_type in ("siglip", "siglip2")

    def _dimension(self, config: dict) -> int | None:
        return config.get("projection_dim") or (config.get("text_config") or {}).get("hidden_size")

    def text_items(self, texts: Sequence[str], *, truncate: bool) -> list[MediaItem]:
        if not self.pad_to_max_length:
            return super().text_items(texts, truncate=truncate)
        items = []
        for ids in self.tokenize(texts, truncate=truncate):
            with self.tokenizer_lock:  # pad sets the fast tokenizer's shared padding state too
                padded = self.tokenizer.pad({"input_ids": ids}, padding="max_length", max_length=self.max_length)
            arrays = {k: np.asarray(v, dtype=np.int64) for k, v in padded.items()}
            items.append(MediaItem("text", arrays, len(ids), self.max_length))
        return items

    def image_items(self, images: list) -> list[MediaItem]:
        if not images:
            return []
        processed = self.processor.image_processor(images, return_tensors="np")
        pixels = processed["pixel_values"].astype(np.float32)
        if "pixel_attention_mask" in processed:  # SigLIP 2 NaFlex: (patches, values) per image, a patch mask
            masks = processed["pixel_attention_mask"].astype(np.int64)
            shapes = processed["spatial_shapes"].astype(np.int64)
            return [MediaItem("image", {"pixel_values": np.ascontiguousarray(p), "pixel_attention_mask": m,
                                        "spatial_shapes": s}, int(m.sum()))
                    for p, m, s in zip(pixels, masks, shapes)]
        patches = self._patches(pixels.shape[-2:])
        return [MediaItem("image", {"pixel_values": np.ascontiguousarray(p)}, patches) for p in pixels]

    def _patches(self, hw) -> int:
        vision = self.info.config.get("vision_config") or {}
        patch = int(vision.get("patch_size") or 16)
        return (int(hw[0]) // patch) * (int(hw[1]) // patch) + 1  # + the class token
