"""Vision–language embedders of the Qwen2-VL layout (GME-Qwen2-VL), of Qwen2.5-VL and of Qwen3-VL
(Qwen3-VL-Embedding), on tiny models saved as the published ones are (``*ForConditionalGeneration`` weights, the
processor files and chat template as Qwen2-VL-Instruct publishes them).

The reference is transformers' own code as the model cards use it: the layout's processor (its PIL image
processor; the video processor needs torchvision, which this environment lacks) on the formatted conversation, the
model's forward, the last token's state, L2-normalized. For ``input`` texts and images the conversation is written
as the layout's embedders write it: GME's ``gme_inference.py`` format string (system instruction, image then text,
generation prompt, ``<|endoftext|>``), or Qwen3-VL-Embedding's (its instruction as the system message through the
chat template, generation prompt); for ``messages`` it is the processor's ``apply_chat_template``. Each reference
vector comes from a forward of that conversation alone; the server's come from padded batches."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from core.api.app import create_app
from core.config import ModelSpec, Settings
from core.engine import Engine
from core.inprocess import AsyncModels
from core.tasks.embed import EmbedRequest
from tests.support import vlm_models
from tests.support.engines import run_concurrently

MIN_COSINE = 0.99999
GME_DEFAULT = "You are a helpful assistant."
QWEN3_VL_EMBEDDING_DEFAULT = "Represent the user's input."
QUERY_INSTRUCTION = "Find an image that matches the given text."


@pytest.fixture(scope="session", params=list(vlm_models.FAMILIES))
def family(request) -> str:
    return request.param


def _image(w: int, h: int, seed: int):
    from PIL import Image

    rng = np.random.RandomState(seed)
    return Image.fromarray((rng.rand(h, w, 3) * 255).astype("uint8"))


def _uri(image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


#: images of several aspect ratios; the last is over the processor's max_pixels and is resized down
IMAGES = [_image(90, 130, 1), _image(200, 60, 2), _image(56, 56, 3), _image(400, 300, 4)]
URIS = [_uri(im) for im in IMAGES]


def _conversations():
    """name → (messages with image_url parts, add_generation_prompt, continue_final_message)."""
    def img(i):
        return {"type": "image_url", "image_url": {"url": URIS[i]}}

    return {
        "text": ([{"role": "user", "content": "a tiny red boat on a lake"}], True, False),
        "text-parts+system": ([{"role": "system", "content": QUERY_INSTRUCTION},
                               {"role": "user", "content": [{"type": "text", "text": "two dogs play in the snow"}]}],
                              False, False),
        "image": ([{"role": "user", "content": [img(0)]}], True, False),
        "interleaved": ([{"role": "user", "content": [{"type": "text", "text": "left:"}, img(1),
                                                      {"type": "text", "text": "right:"}, img(2),
                                                      {"type": "text", "text": "which one is brighter?"}]}],
                        True, False),
        "gme-suffix": ([{"role": "user", "content": [img(3), {"type": "text", "text": "a photo"}]},
                        {"role": "assistant", "content": "<|endoftext|>"}], False, True),
    }


@pytest.fixture(scope="session")
def reference(family):
    """``gme(text, image, instruction)`` and ``chat(messages, add_generation_prompt, continue_final_message)``:
    the model card's transformers code, one conversation per forward."""
    import torch
    import transformers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    processor_class, architecture = vlm_models.FAMILIES[family]
    folder = vlm_models.gme_folder(family)

    class Processor(getattr(transformers, processor_class)):  # without the video processor (it needs torchvision)
        def check_argument_for_proper_class(self, argument_name, argument):
            return None if argument is None else super().check_argument_for_proper_class(argument_name, argument)

    template = json.loads((folder / "chat_template.json").read_text())["chat_template"]
    processor = Processor(image_processor=Qwen2VLImageProcessorPil.from_pretrained(str(folder)),
                          tokenizer=transformers.AutoTokenizer.from_pretrained(str(folder)), video_processor=None,
                          chat_template=template)
    model = getattr(transformers, architecture).from_pretrained(str(folder)).eval()

    def forward(prompt: str, images: list) -> np.ndarray:
        inputs = processor(text=[prompt], images=images or None, return_tensors="pt")
        with torch.inference_mode():
            last = model.model(**inputs).last_hidden_state[:, -1]
        return torch.nn.functional.normalize(last, dim=-1)[0].numpy()

    def gme(text, image, instruction=None):
        """GME's gme_inference.py: its own format string."""
        content = ("<|vision_start|><|image_pad|><|vision_end|>" if image is not None else "") + (text or "")
        prompt = (f"<|im_start|>system\n{instruction or GME_DEFAULT}<|im_end|>\n<|im_start|>user\n{content}"
                  "<|im_end|>\n<|im_start|>assistant\n<|endoftext|>")
        return forward(prompt, [] if image is None else [image])

    def qwen3_vl_embedding(text, image, instruction=None):
        """Qwen3-VL-Embedding's script: system instruction and user turn through the chat template, generation
        prompt added, the last token read."""
        parts = ([{"type": "image"}] if image is not None else []) + ([{"type": "text", "text": text}] if text else [])
        prompt = processor.apply_chat_template(
            [{"role": "system", "content": [{"type": "text", "text": instruction or QWEN3_VL_EMBEDDING_DEFAULT}]},
             {"role": "user", "content": parts}], tokenize=False, add_generation_prompt=True)
        return forward(prompt, [] if image is None else [image])

    def chat(messages, add_generation_prompt, continue_final_message):
        images, turns = [], []
        for m in messages:
            if isinstance(m["content"], str):
                turns.append(m)
                continue
            parts = []
            for p in m["content"]:
                if p["type"] == "image_url":
                    images.append(IMAGES[URIS.index(p["image_url"]["url"])])
                    parts.append({"type": "image"})
                else:
                    parts.append(p)
            turns.append({"role": m["role"], "content": parts})
        prompt = processor.apply_chat_template(turns, tokenize=False, add_generation_prompt=add_generation_prompt,
                                               continue_final_message=continue_final_message)
        return forward(prompt, images)

    plain = qwen3_vl_embedding if family == "qwen3_vl" else gme  # the layout's own convention for plain input
    return type("Reference", (), {"gme": staticmethod(gme), "plain": staticmethod(plain), "chat": staticmethod(chat)})


@pytest.fixture(scope="session")
def engine(family):
    return Engine.load(ModelSpec(path=vlm_models.gme_folder(family), name="gme"), Settings(threads=2))


def _report(family: str, what: str, got, ref) -> float:
    family = {"qwen2_vl": "gme-qwen2-vl", "qwen2_5_vl": "qwen2.5-vl", "qwen3_vl": "qwen3-vl-embedding"}[family]
    got, ref = np.atleast_2d(np.asarray(got)), np.atleast_2d(np.asarray(ref))
    cos = (got * ref).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref, axis=1)
    print(f"\n[parity] {family} torch {what}: min cosine {cos.min():.7f} over {len(cos)}")
    assert cos.min() >= MIN_COSINE, f"{what}: worst cosine {cos.min():.7f}"
    return float(cos.min())


def test_auto_serves_it_on_torch_as_a_vision_language_embedder(family, engine):
    assert engine.task.name == "vlm_embed" and engine.backend.name == "torch"
    assert "vision–language" in engine.choice.reason
    described = engine.describe()
    assert described["modalities"] == ["text", "image"] and described["dimension"] == 64


@pytest.mark.parametrize("instruction", [None, QUERY_INSTRUCTION])
def test_input_texts_follow_the_layouts_convention(family, engine, reference, sentences, instruction):
    texts = sentences[:12]
    got = engine.run_sync(EmbedRequest(texts=texts, prompt=instruction)).vectors  # one padded batch
    ref = np.stack([reference.plain(t, None, instruction) for t in texts])
    _report(family, f"input texts (instruction={instruction is not None})", got, ref)


def test_input_images_follow_the_layouts_convention(family, engine, reference):
    got = engine.run_sync(EmbedRequest(modality="image", inputs=URIS)).vectors
    ref = np.stack([reference.plain(None, im) for im in IMAGES])
    _report(family, "input images (4 sizes, one resized down)", got, ref)


def _chat_request(names):
    from core.serving.inputs import chat_messages
    from core.media import MediaFetcher

    settings = Settings()
    conversations, refs = [], []
    for name in names:
        messages, gen, cont = _conversations()[name]
        conversation, own = chat_messages(messages, settings, add_generation_prompt=gen, continue_final_message=cont)
        for m in conversation.messages:  # this request's media list holds every conversation's images
            for p in m["content"] if isinstance(m["content"], list) else ():
                if p["type"] == "image":
                    p["index"] += len(refs)
        conversations.append(conversation)
        refs.extend(own)
    return EmbedRequest(conversations=conversations, inputs=refs, media=MediaFetcher())


@pytest.mark.parametrize("name", list(_conversations()))
def test_messages_alone_match_the_chat_template_reference(family, engine, reference, name):
    got = engine.run_sync(_chat_request([name])).vectors
    _report(family, f"messages {name}", got, reference.chat(*_conversations()[name]))
    if name == "gme-suffix":  # GME's own format, sent as messages: an open assistant turn holding <|endoftext|>
        _report(family, "messages in GME's format vs gme_inference.py's", got, reference.gme("a photo", IMAGES[3]))


def test_the_vectors_tell_inputs_apart(family, engine, sentences):
    """The parity above is not that of a model that answers one vector for everything."""
    vectors = np.concatenate([engine.run_sync(EmbedRequest(texts=sentences[:6])).vectors,
                              engine.run_sync(EmbedRequest(modality="image", inputs=URIS)).vectors])
    cos = vectors @ vectors.T
    assert cos[~np.eye(len(vectors), dtype=bool)].max() < 0.95


def test_a_batch_mixing_text_images_and_interleaved_equals_each_alone(family, engine, reference):
    names = list(_conversations())
    mixed = engine.run_sync(_chat_request(names)).vectors  # one padded batch: text rows beside image rows
    alone = np.concatenate([engine.run_sync(_chat_request([n])).vectors for n in names])
    assert mixed.shape == (len(names), 64)
    _report(family, "mixed batch vs each alone", mixed, alone)
    _report(family, "mixed batch vs reference", mixed, np.stack([reference.chat(*_conversations()[n]) for n in names]))
    # and through the batcher: concurrent requests of every kind
    concurrent = run_concurrently(engine, [_chat_request([n]) for n in names] * 2)
    _report(family, "concurrent requests", np.concatenate([r.vectors for r in concurrent]),
            np.concatenate([alone, alone]))


def test_messages_over_http_and_in_process(family, reference):
    spec = ModelSpec(path=vlm_models.gme_folder(family), name="gme")
    conversations = _conversations()
    with TestClient(create_app(Settings(models=[spec], threads=2))) as client:
        got = []
        for messages, gen, cont in conversations.values():
            r = client.post("/v1/embeddings", json={"model": "gme", "messages": messages,
                                                    "add_generation_prompt": gen, "continue_final_message": cont})
            assert r.status_code == 200, r.text
            assert len(r.json()["data"]) == 1 and r.json()["usage"]["prompt_tokens"] > 10
            got.append(r.json()["data"][0]["embedding"])
        ref = np.stack([reference.chat(*c) for c in conversations.values()])
        _report(family, "messages over HTTP", got, ref)
        r = client.post("/v1/embeddings", json={"model": "gme", "modality": "image", "input": URIS[:2]})
        assert r.status_code == 200, r.text
        _report(family, "image input over HTTP", [d["embedding"] for d in r.json()["data"]],
                [reference.plain(None, im) for im in IMAGES[:2]])
        r = client.get("/v1/models")
        card = next(m for m in r.json()["data"] if m["id"] == "gme")
        assert card["modalities"] == ["text", "image"] and card["task"] == "vlm_embed"

    async def in_process():
        async with AsyncModels(Settings(models=[spec], threads=2)) as api:
            chats = await api.embed_messages([c[0] for c in conversations.values() if c[1]], add_generation_prompt=True)
            texts = await api.embed(["a tiny red boat"], prompt=QUERY_INSTRUCTION)
            return chats, texts

    chats, texts = asyncio.run(in_process())
    _report(family, "messages in-process", chats,
            np.stack([reference.chat(*c) for c in conversations.values() if c[1]]))
    _report(family, "input text in-process", texts, reference.plain("a tiny red boat", None, QUERY_INSTRUCTION)[None])
