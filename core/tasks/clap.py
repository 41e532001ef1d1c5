"""CLAP audio–text embeddings: ``get_text_features`` / ``get_audio_features`` (both L2-normalized by the
model). Audio is decoded to mono and resampled to the feature extractor's ``sampling_rate``; the
extractor's own settings (truncation, padding, max length) come from the folder's processor config."""

from __future__ import annotations

import logging
from typing import ClassVar

import numpy as np

from core.tasks.multimodal import MediaItem, MultiModalEmbedTask

log = logging.getLogger(__name__)


class ClapTask(MultiModalEmbedTask):
    name: ClassVar[str] = "clap"
    head: ClassVar[str] = "towers"
    modalities: ClassVar[tuple[str, ...]] = ("text", "audio")

    def __init__(self, info, spec):
        super().__init__(info, spec)
        self.extractor = self.processor.feature_extractor
        self.sampling_rate = int(self.extractor.sampling_rate)
        fusion = bool((info.config.get("audio_config") or {}).get("enable_fusion", False))
        if self.extractor.truncation == "fusion" and not fusion:
            # a fusion extractor feeds 4 mel channels; an unfused model takes one
            log.warning("%s: processor says truncation='fusion' but the model has no fusion; using 'rand_trunc'",
                        info.folder)
            self.extractor.truncation = "rand_trunc"

    def audio_items(self, waves: list[np.ndarray]) -> list[MediaItem]:
        if not waves:
            return []
        feats = self.extractor(waves, sampling_rate=self.sampling_rate, return_tensors="np")
        features = np.asarray(feats["input_features"], dtype=np.float32)  # (n, channels, frames, mels)
        longer = np.asarray(feats["is_longer"]).astype(bool).reshape(len(waves), -1)
        frames = int(features.shape[2])
        return [
            MediaItem("audio", {"input_features": np.ascontiguousarray(f), "is_longer": lg}, frames)
            for f, lg in zip(features, longer)
        ]

    def describe(self) -> dict:
        return {**super().describe(), "sampling_rate": self.sampling_rate, "truncation": self.extractor.truncation}
