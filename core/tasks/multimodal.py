"""Shared machinery of the multi-modal embedding tasks (CLIP, CLAP, ColPali).

- ``fetch_inputs`` (event loop) fetches a request's http(s) references at once, before it takes a
  worker thread; ``prepare`` (worker thread) decodes media through :class:`core.media.MediaFetcher` and
  runs the model's own ``transformers`` processor (tokenizer, image processor, feature extractor) one
  item at a time — decode, preprocess, release — so a request holds one decoded image at a time, and
  an item's arrays never depend on what it is batched with. Each item's ``cost`` is what the
  batcher budgets: text tokens, image patches (or a ColPali page's sequence length), audio frames.
- Batches hold one modality: ``batch_group`` keys the batcher by the request's modality, so the text
  and image towers never share a backend call.
- ``collate`` right-pads token sequences (positions of real tokens stay those of a single-item forward)
  and stacks fixed-size media tensors.
- Single-vector models return one vector per item; multi-vector models (ColPali) return per item a
  float32 array (tokens, dim) of its real (unpadded) tokens.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import ClassVar, Mapping, Sequence

import numpy as np

from core.capabilities import Capability
from core.config import ModelSpec
from core.errors import BackendFailure, InvalidInput, TesseraError, TooLarge, Unsupported, require
from core.loading import ModelInfo
from core.tasks.base import Task
from core.tasks.embed import EmbedRequest, EmbedResult
from core.tasks.vectors import l2_normalize, shape_vectors
from core.tasks.chunking import refuse_long_input_options


#: 1-D per-item arrays padded to the batch's longest item (everything else is stacked as is)
SEQUENCE_KEYS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(slots=True)
class MediaItem:
    modality: str
    arrays: dict[str, np.ndarray]  # one item, no batch axis
    cost: int  # tokens / patches / frames: the batch budget unit
    length: int = 0  # sequence length (tokens returned by a multi-vector model)


class MultiModalEmbedTask(Task):
    name: ClassVar[str]
    head: ClassVar[str]
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.EMBEDDINGS})
    modalities: ClassVar[tuple[str, ...]]
    multi_vector: ClassVar[bool] = False
    #: L2-normalize when the request does not say (CLIP/CLAP similarity is a cosine)
    default_normalize: ClassVar[bool] = True
    #: audio models: the rate decoded audio is resampled to (from the feature extractor's config)
    sampling_rate: int = 0
    #: the engine awaits ``fetch_inputs`` on the event loop before ``prepare``
    fetches_inputs: ClassVar[bool] = True

    def __init__(self, info: ModelInfo, spec: ModelSpec):
        transformers = require("transformers", "torch")
        self.info = info
        self.spec = spec
        self.processor = transformers.AutoProcessor.from_pretrained(str(info.folder))
        self.tokenizer = self.processor.tokenizer
        #: a transformers fast tokenizer keeps its truncation and padding settings on the shared Rust object and
        #: sets them on every call: two preparing threads that call it with different settings can each get
        #: the other's (a text meant to be cut at max_length comes back whole). Held around every call.
        self.tokenizer_lock = threading.Lock()
        self.pad_id = int(self.tokenizer.pad_token_id or 0)
        self.dimension = self._dimension(info.config)
        self.max_length = self._max_length(info.config)

    # model facts (overridden per family) ---------------------------------------------------------
    def _dimension(self, config: dict) -> int | None:
        return config.get("projection_dim")

    def _max_length(self, config: dict) -> int:
        text = config.get("text_config") or {}
        limits = [text.get("max_position_embeddings") or 10**6, self.tokenizer.model_max_length or 10**6]
        if self.spec.max_length:
            limits.append(self.spec.max_length)
        return int(min(limits))

    def batch_group(self, request: EmbedRequest) -> str:
        return request.modality

    # worker thread ------------------------------------------------------------------------------
    def prepare(self, request: EmbedRequest) -> list[MediaItem]:
        refuse_long_input_options(request, self.name)
        modality = request.modality
        if modality not in self.modalities:
            raise InvalidInput(
                f"modality {modality!r} is not served by this model; its modalities: {list(self.modalities)}",
                param="modality",
            )
        if request.dimensions is not None:
            if self.multi_vector:
                raise InvalidInput("'dimensions' is not supported by multi-vector models", param="dimensions")
            if self.dimension and request.dimensions > self.dimension:
                raise InvalidInput(
                    f"dimensions={request.dimensions} exceeds the model's dimension {self.dimension}",
                    param="dimensions",
                )
        if modality == "text":
            if request.token_ids is not None:
                raise InvalidInput("token-id input is not supported by multi-modal models; send text", param="input")
            from core.tokenization import unencodable

            texts = list(request.texts or [])
            error = unencodable(texts)  # a lone surrogate: the processors' tokenizers raise TypeError on it
            if error is not None:
                raise error
            return self.text_items(texts, truncate=request.truncate)
        fetcher = request.media_fetcher()
        items: list[MediaItem] = []
        resized = self.image_resize() if modality == "image" else None
        for i, ref in enumerate(request.inputs or []):  # decode → preprocess → release, one at a time
            if modality == "image":
                items.extend(self.image_items([fetcher.image(ref, index=i, resized=resized)]))
            else:
                items.extend(self.audio_items([fetcher.audio(ref, index=i, sampling_rate=self.sampling_rate)]))
        return items

    async def fetch_inputs(self, request: EmbedRequest) -> None:
        """Event loop, before ``prepare``: fetch the request's URLs concurrently (no thread held)."""
        if request.modality == "text" or request.modality not in self.modalities or not request.inputs:
            return
        from core.media import AUDIO_TYPES, IMAGE_TYPES

        accepted = IMAGE_TYPES if request.modality == "image" else AUDIO_TYPES
        await request.media_fetcher().prefetch(request.inputs, accepted=accepted)

    def tokenize(self, texts: Sequence[str], *, truncate: bool) -> list[list[int]]:
        out = []
        for i, text in enumerate(texts):
            with self.tokenizer_lock:
                ids = list(self.tokenizer(text)["input_ids"])
            if len(ids) > self.max_length:
                if not truncate:
                    raise TooLarge(
                        f"input[{i}] has {len(ids)} tokens; the model's limit is {self.max_length}", param="input"
                    )
                with self.tokenizer_lock:
                    ids = list(self.tokenizer(text, truncation=True, max_length=self.max_length)["input_ids"])
            out.append(ids)
        return out

    def text_items(self, texts: Sequence[str], *, truncate: bool) -> list[MediaItem]:
        items = []
        for ids in self.tokenize(texts, truncate=truncate):
            arr = np.asarray(ids, dtype=np.int64)
            items.append(MediaItem("text", {"input_ids": arr, "attention_mask": np.ones_like(arr)}, len(ids), len(ids)))
        return items

    def warmup_batches(self, batch_tokens: int, max_batch_size: int) -> list[Mapping[str, np.ndarray]]:
        """Per modality the model embeds: text at each length bucket, one full batch of a blank image or of
        a second of silence (decoded and preprocessed as requests are)."""
        from core.tasks.base import warmup_count, warmup_lengths

        batches = []
        for modality in self.modalities:
            if modality == "text":
                for length in warmup_lengths(self.max_length):
                    try:  # a text of about `length` tokens, prepared as a request's
                        (one,) = self.text_items([" ".join(["warm"] * max(1, length - 2))], truncate=True)
                    except TesseraError:  # over the model's limit (prefix tokens): that bucket never forms
                        continue
                    batches.append(self.collate([one] * warmup_count(one.cost, batch_tokens, max_batch_size)))
                continue
            if modality == "image":
                from PIL import Image

                (one,) = self.image_items([Image.new("RGB", (224, 224), (127, 127, 127))])
            else:
                (one,) = self.audio_items([np.zeros(self.sampling_rate or 16000, dtype=np.float32)])
            batches.append(self.collate([one] * warmup_count(one.cost, batch_tokens, max_batch_size)))
        return batches

    def image_items(self, images: list) -> list[MediaItem]:
        raise InvalidInput(f"model {self.name} does not embed images", param="modality")

    def image_resize(self):
        """What the model's image processor resizes an image to (``core.media.processor_resize``: checked, with
        the image's aspect ratio, from its header before it is decoded); None when the processor does not say."""
        from core.media import processor_resize

        images = getattr(self.processor, "image_processor", None)
        if images is None or getattr(images, "do_resize", True) is False:
            return None
        return processor_resize(getattr(images, "size", None))

    def audio_items(self, waves: list[np.ndarray]) -> list[MediaItem]:
        raise InvalidInput(f"model {self.name} does not embed audio", param="modality")

    # inference thread ---------------------------------------------------------------------------
    def collate(self, items: Sequence[MediaItem]) -> Mapping[str, np.ndarray]:
        modality = items[0].modality
        if any(it.modality != modality for it in items):  # the batcher groups by modality; never mix towers
            raise BackendFailure(f"internal: a batch of {self.name} mixed modalities")
        width = max(it.length for it in items)
        batch: dict[str, np.ndarray] = {}
        for key in items[0].arrays:
            if key in SEQUENCE_KEYS:
                fill = self.pad_id if key == "input_ids" else 0
                padded = np.full((len(items), width), fill, dtype=np.int64)
                for row, it in enumerate(items):
                    seq = it.arrays[key]
                    padded[row, : seq.shape[0]] = seq
                batch[key] = padded
            else:
                batch[key] = np.stack([it.arrays[key] for it in items])
        return batch

    def postprocess(self, outputs: Mapping[str, np.ndarray], items: Sequence[MediaItem]) -> list[np.ndarray]:
        emb = outputs["embeddings"]
        if self.multi_vector:
            return [np.ascontiguousarray(emb[row, : it.length], dtype=np.float32) for row, it in enumerate(items)]
        return list(np.asarray(emb, dtype=np.float32))

    # the request's own ----------------------------------------------------------------------------
    def finish(self, request: EmbedRequest, items: Sequence[MediaItem], results: list[np.ndarray]) -> EmbedResult:
        normalize = self.default_normalize if request.normalize is None else request.normalize
        tokens = sum(it.cost for it in items)
        if self.multi_vector:
            return EmbedResult([l2_normalize(v) if normalize else v for v in results], tokens)
        vectors = np.stack(results) if results else np.zeros((0, self.dimension or 0), np.float32)
        return EmbedResult(shape_vectors(vectors, request.dimensions, normalize), tokens)

    def shape(self, vectors: np.ndarray, request: EmbedRequest) -> np.ndarray:
        if self.multi_vector:
            raise Unsupported(f"the {self.name} model returns multi-vector embeddings")
        normalize = self.default_normalize if request.normalize is None else request.normalize
        return shape_vectors(vectors, request.dimensions, normalize)

    def describe(self) -> dict:
        return {
            "task": self.name,
            "capabilities": sorted(self.capabilities),
            "modalities": list(self.modalities),
            "dimension": self.dimension,
            "multi_vector": self.multi_vector,
            "max_length": self.max_length,
            "normalize": self.default_normalize,
        }
