"""Vision–language embedders of the Qwen2-VL layout (GME-Qwen2-VL; Qwen2.5-VL backbones; Qwen3-VL-Embedding): one
vector per conversation — text, images, or both interleaved — read at the last token of the language model's last
hidden state and L2-normalized, as GME's ``gme_inference.py``, Qwen3-VL-Embedding's script and vLLM's pooling of
these models do.

- A request is a list of :class:`Conversation`: chat ``messages`` (``/v1/embeddings`` with ``messages``, vLLM's
  chat-embeddings shape) rendered through the model's own chat template, or plain ``input`` texts / images in the
  layout's convention (:data:`INPUT_FORMATS`): a system message holding the instruction (``prompt``; GME's default
  ``You are a helpful assistant.``, Qwen3-VL-Embedding's ``Represent the user's input.``), the user turn holding the
  image and/or the text, the assistant's generation prompt, and for GME ``<|endoftext|>``; the last token's state is
  the vector.
- ``prepare`` (worker thread) decodes each image through :class:`core.media.MediaFetcher` (limits, SSRF guard,
  the aspect ratio within Qwen2-VL's own 200:1; anything else the processor refuses with a ``ValueError`` is a 400
  naming the item too), then runs transformers' own Qwen2-VL processor: its PIL image processor (resized within the folder's
  ``min_pixels``/``max_pixels``, patches + ``image_grid_thw``) and the tokenizer, which expands each image
  placeholder to the image's tokens and marks them in ``mm_token_type_ids`` (the model's M-RoPE reads it). An
  item's cost is its sequence length, image tokens included; a conversation over the model's length is refused
  (cutting it would drop the token the vector is read from).
- ``collate`` right-pads the token rows (each row's real tokens keep a single-item forward's positions) and
  concatenates the images' patches and grids in item order, as the processor does for a batch.
- The torch backend only: the ``vlm-last-token`` head (core/backends/heads.py) runs ``Qwen2VLModel`` (or the
  layout's) and gathers each row's last real token; no exporter or compiler handles the vision tower with M-RoPE."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from core.capabilities import Capability
from core.config import ModelSpec
from core.errors import InvalidInput, TooLarge, Unsupported, require
from core.loading import ModelInfo, custom_code
from core.tasks.base import Task
from core.tasks.chunking import refuse_long_input_options
from core.tasks.embed import EmbedRequest, EmbedResult
from core.tasks.prompts import resolve_prompt
from core.tasks.vectors import shape_vectors

#: model_type → the transformers processor class of the layout (all use Qwen2-VL's image processor)
PROCESSORS = {"qwen2_vl": "Qwen2VLProcessor", "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor"}


@dataclass(frozen=True, slots=True)
class InputFormat:
    """How a layout's embedders write plain ``input`` as a conversation: the system message's default
    instruction, and what follows the generation prompt (the token the vector is read at)."""

    instruction: str
    suffix: str = ""


#: GME (gme_inference.py): "You are a helpful assistant." and <|endoftext|> after the generation prompt
GME = InputFormat("You are a helpful assistant.", "<|endoftext|>")
#: Qwen3-VL-Embedding: "Represent the user's input.", read at the generation prompt's last token
QWEN3_VL_EMBEDDING = InputFormat("Represent the user's input.")
INPUT_FORMATS = {"qwen2_vl": GME, "qwen2_5_vl": GME, "qwen3_vl": QWEN3_VL_EMBEDDING}
#: the most tokens one image becomes: GME's model card bound (``max_image_tokens=1280``, 1280·28·28 pixels), applied
#: when the folder's ``max_pixels`` allows more (Qwen2-VL's own allows 16384 tokens, whose vision attention over
#: 65 536 patches would let one request hold a GPU for seconds)
MAX_IMAGE_TOKENS = 1280
#: text a user may not send: the processor expands these placeholders into image/video tokens
PLACEHOLDERS = ("<|image_pad|>", "<|video_pad|>")

_SEQUENCES = ("input_ids", "attention_mask", "mm_token_type_ids")


@dataclass(slots=True)
class Conversation:
    """One embedding's input: chat messages whose content is a string or a list of parts, ``{"type": "text",
    "text": ...}`` or ``{"type": "image", "index": i}`` (``i``: the image's place in the request's media list)."""

    messages: list[dict[str, Any]]
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    suffix: str = ""

    def image_indices(self) -> list[int]:
        return [part["index"] for m in self.messages if isinstance(m["content"], list)
                for part in m["content"] if part["type"] == "image"]


@dataclass(slots=True)
class VlmItem:
    arrays: dict[str, np.ndarray]  # token rows (1-D) and, with images, pixel_values (patches, dim), image_grid_thw
    cost: int  # tokens, image tokens included
    length: int = 0
    images: int = 0


def input_conversation(text: str | None, image: int | None, instruction: str | None,
                       form: InputFormat = GME) -> Conversation:
    """A plain input as its layout's embedders write it (GME's gme_inference.py, Qwen3-VL-Embedding's script): the
    system instruction, the user turn with the image first, the assistant's generation prompt, then the format's
    suffix."""
    parts: list[dict[str, Any]] = []
    if image is not None:
        parts.append({"type": "image", "index": image})
    if text is not None:
        parts.append({"type": "text", "text": text})
    return Conversation([{"role": "system", "content": instruction or form.instruction},
                         {"role": "user", "content": parts}], add_generation_prompt=True, suffix=form.suffix)


def _param(where: str) -> str:
    """The request field an item's error names: ``messages`` for a conversation sent as such, else ``input``."""
    return "messages" if where == "messages" else "input"


def images_only_processor(processor_class: type, image_processor, tokenizer, chat_template: str | None):
    """transformers' processor of the layout without its video processor, which needs torchvision (the
    processor's constructor checks every part's class, and that class cannot be imported without it); the
    processing itself is the class's own."""

    class ImagesOnly(processor_class):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument is None and argument_name == "video_processor":
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return ImagesOnly(image_processor=image_processor, tokenizer=tokenizer, video_processor=None,
                      chat_template=chat_template)


def folder_chat_template(folder: Path, tokenizer) -> str | None:
    """The chat template a folder carries: ``chat_template.jinja``, ``chat_template.json`` (Qwen2-VL's), or
    the tokenizer's own."""
    import json

    if (folder / "chat_template.jinja").exists():
        return (folder / "chat_template.jinja").read_text()
    if (folder / "chat_template.json").exists():
        return json.loads((folder / "chat_template.json").read_text()).get("chat_template")
    return getattr(tokenizer, "chat_template", None)


class VlmEmbedTask(Task):
    name: ClassVar[str] = "vlm_embed"
    head: ClassVar[str] = "vlm-last-token"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.EMBEDDINGS})
    modalities: ClassVar[tuple[str, ...]] = ("text", "image")
    fetches_inputs: ClassVar[bool] = True
    #: the engine and the serving layer: ``messages`` are accepted
    takes_messages: ClassVar[bool] = True

    def __init__(self, info: ModelInfo, spec: ModelSpec):
        if info.model_type not in PROCESSORS:
            raise Unsupported(f"{info.folder}: model_type {info.model_type!r} is not a vision–language layout the "
                              f"vlm_embed task serves; it serves {sorted(PROCESSORS)}", code="unsupported_architecture")
        code = custom_code(info.config)
        if code is not None:  # jina-embeddings-v4: its own code over Qwen2.5-VL (task adapters, its own pooling)
            raise Unsupported(f"{info.folder}: a vision–language model with its own code ({code}); the vlm_embed task "
                              "runs transformers' built-in Qwen2-VL class and GME's last-token pooling, which would "
                              "drop what that code does and give other vectors. Serve it with its model card's code",
                              code="unsupported_architecture")
        transformers = require("transformers", "torch")
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        self.info, self.spec = info, spec
        self.input_format = INPUT_FORMATS[info.model_type]
        folder = Path(info.folder)
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
        self.chat_template = folder_chat_template(folder, tokenizer)
        if not self.chat_template:
            raise InvalidInput(f"{folder}: no chat template (chat_template.json, chat_template.jinja or the "
                               "tokenizer's); a vision–language embedder formats its inputs through it")
        images = Qwen2VLImageProcessorPil.from_pretrained(str(folder))
        cap = MAX_IMAGE_TOKENS * (images.patch_size * images.merge_size) ** 2
        if images.size.longest_edge > cap:
            images = Qwen2VLImageProcessorPil.from_pretrained(str(folder), max_pixels=cap)
        self.processor = images_only_processor(getattr(transformers, PROCESSORS[info.model_type]), images, tokenizer,
                                               self.chat_template)
        self.tokenizer = tokenizer
        #: the fast tokenizer's padding/truncation state is shared: one call at a time (as the multi-modal tasks)
        self.lock = threading.Lock()
        self.pad_id = int(tokenizer.pad_token_id or 0)
        text = info.config.get("text_config") or info.config
        self.dimension = int(text.get("hidden_size") or 0) or None
        limits = [int(text.get("max_position_embeddings") or 32768)]
        if spec.max_length:
            limits.append(int(spec.max_length))
        self.max_length = min(limits)

    # event loop --------------------------------------------------------------------------------
    async def fetch_inputs(self, request: EmbedRequest) -> None:
        if request.inputs and (request.modality == "image" or request.conversations is not None):
            from core.media import IMAGE_TYPES

            await request.media_fetcher().prefetch(request.inputs, accepted=IMAGE_TYPES)


    # worker thread ------------------------------------------------------------------------------
    def conversations(self, request: EmbedRequest) -> list[Conversation]:
        """The request's conversations: its ``messages``, or its ``input`` in GME's convention."""
        if request.conversations is not None:
            return list(request.conversations)
        if request.modality not in self.modalities:
            raise InvalidInput(f"modality {request.modality!r} is not served by this model; its modalities: "
                               f"{list(self.modalities)}", param="modality")
        if request.modality == "image":
            return [input_conversation(None, i, None, self.input_format) for i in range(len(request.inputs or ()))]
        if request.token_ids is not None:
            raise InvalidInput("token-id input is not supported by vision–language models; send text", param="input")
        instruction = resolve_prompt(self.info, self.spec, request.prompt, request.prompt_name)
        return [input_conversation(text, None, instruction, self.input_format) for text in request.texts or ()]

    def prepare(self, request: EmbedRequest) -> list[VlmItem]:
        refuse_long_input_options(request, self.name)
        if request.dimensions is not None and self.dimension and request.dimensions > self.dimension:
            raise InvalidInput(f"dimensions={request.dimensions} exceeds the model's dimension {self.dimension}",
                               param="dimensions")
        items = []
        for n, conversation in enumerate(self.conversations(request)):
            fetcher = request.media_fetcher()
            images = [fetcher.image(request.inputs[i], index=i) for i in conversation.image_indices()]
            items.append(self.item(conversation, images, where="messages" if request.conversations else f"input[{n}]"))
        return items

    def render(self, conversation: Conversation, where: str) -> str:
        """The conversation as the model's chat template writes it (images as their placeholders)."""
        from jinja2 import TemplateError

        messages = [{"role": m["role"], "content": m["content"] if isinstance(m["content"], str)
                     else [{"type": "image"} if p["type"] == "image" else p for p in m["content"]]}
                    for m in conversation.messages]
        for m in messages:
            texts = [m["content"]] if isinstance(m["content"], str) else [p.get("text", "") for p in m["content"]]
            for text in texts:
                if any(t in text for t in PLACEHOLDERS):
                    raise InvalidInput(f"{where}: text may not hold the image placeholder tokens {list(PLACEHOLDERS)}; "
                                       "send images as image_url parts", param=_param(where))
        try:
            with self.lock:
                prompt = self.tokenizer.apply_chat_template(
                    messages, chat_template=self.chat_template, tokenize=False,
                    add_generation_prompt=conversation.add_generation_prompt,
                    continue_final_message=conversation.continue_final_message)
        except (TemplateError, ValueError) as exc:
            raise InvalidInput(f"{where}: the model's chat template refused the messages: {exc}",
                               param=_param(where)) from None
        return prompt + conversation.suffix

    def item(self, conversation: Conversation, images: list, *, where: str) -> VlmItem:
        prompt = self.render(conversation, where)
        try:
            with self.lock:
                out = self.processor(text=[prompt], images=images or None, return_tensors="np")
        except ValueError as exc:  # e.g. smart_resize: an image whose aspect ratio passes 200
            raise InvalidInput(f"{where}: the model's processor refused the input: {exc}", param=_param(where),
                               code="invalid_media" if images else "invalid_input") from None
        arrays = {k: np.ascontiguousarray(np.asarray(out[k])[0], dtype=np.int64) for k in _SEQUENCES if k in out}
        if images:
            arrays["pixel_values"] = np.ascontiguousarray(out["pixel_values"], dtype=np.float32)
            arrays["image_grid_thw"] = np.ascontiguousarray(out["image_grid_thw"], dtype=np.int64)
        length = int(arrays["input_ids"].shape[0])
        if length > self.max_length:
            raise TooLarge(f"{where} makes {length} tokens (images included); the model's limit is {self.max_length}. "
                           "It is not cut: the vector is read at its last token", param=_param(where))
        return VlmItem(arrays, length, length, len(images))

    def warmup_batches(self, batch_tokens: int, max_batch_size: int) -> list[Mapping[str, np.ndarray]]:
        """A text and an image conversation, as requests are prepared (one batch each)."""
        from PIL import Image

        text = self.item(input_conversation("warm up", None, None, self.input_format), [], where="warm-up")
        blank = Image.new("RGB", (56, 56), (127, 127, 127))
        image = self.item(input_conversation(None, 0, None, self.input_format), [blank], where="warm-up")
        return [self.collate([text]), self.collate([image, text])]

    # inference thread ---------------------------------------------------------------------------
    def collate(self, items: Sequence[VlmItem]) -> Mapping[str, np.ndarray]:
        width = max(it.length for it in items)
        batch: dict[str, np.ndarray] = {}
        for key in _SEQUENCES:
            if key not in items[0].arrays:
                continue
            rows = np.full((len(items), width), self.pad_id if key == "input_ids" else 0, dtype=np.int64)
            for row, it in enumerate(items):
                rows[row, : it.length] = it.arrays[key]
            batch[key] = rows
        with_images = [it for it in items if it.images]
        if with_images:
            batch["pixel_values"] = np.concatenate([it.arrays["pixel_values"] for it in with_images])
            batch["image_grid_thw"] = np.concatenate([it.arrays["image_grid_thw"] for it in with_images])
        return batch

    def postprocess(self, outputs: Mapping[str, np.ndarray], items: Sequence[VlmItem]) -> list[np.ndarray]:
        return list(np.asarray(outputs["embeddings"], dtype=np.float32))

    # the request's own ----------------------------------------------------------------------------
    def finish(self, request: EmbedRequest, items: Sequence[VlmItem], results: list[np.ndarray]) -> EmbedResult:
        vectors = np.stack(results) if results else np.zeros((0, self.dimension or 0), np.float32)
        return EmbedResult(self.shape(vectors, request), sum(it.cost for it in items))

    def shape(self, vectors: np.ndarray, request: EmbedRequest) -> np.ndarray:
        return shape_vectors(vectors, request.dimensions, True if request.normalize is None else request.normalize)

    def describe(self) -> dict:
        return {"task": self.name, "capabilities": sorted(self.capabilities), "modalities": list(self.modalities),
                "dimension": self.dimension, "max_length": self.max_length, "normalize": True, "messages": True}

