"""Tiny vision–language embedders of the Qwen2-VL layout (GME-Qwen2-VL) and of Qwen2.5-VL, saved the way the
published repositories are: ``*ForConditionalGeneration`` weights written by transformers' ``save_pretrained``, the
processor's files as Qwen2-VL-Instruct publishes them (``preprocessor_config.json``, ``chat_template.json``, the
tokenizer).

The tokenizer is a byte-level BPE trained on the test sentences with Qwen2-VL's special tokens; the chat template
is Qwen2-VL-Instruct's (a default system message, ``<|vision_start|><|image_pad|><|vision_end|>`` per image part).
The image processor is transformers' PIL one (``Qwen2VLImageProcessorPil``) with a small ``max_pixels``, so test
images become a few dozen patches."""

from __future__ import annotations

from pathlib import Path

#: Qwen2-VL's special tokens (the Qwen text tokens first, as in its tokenizer)
VLM_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                      "<|image_pad|>", "<|video_pad|>"]

#: Qwen2-VL-Instruct's chat template (its chat_template.json), images and videos as placeholders
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: image size bounds of the tiny processor: 4 to 36 merged tokens (16 to 144 patches) per image
MIN_TOKENS, MAX_TOKENS = 4, 36


def build_tokenizer(out: Path):
    """A byte-level BPE with Qwen2-VL's special tokens, saved as a fast tokenizer with the chat template."""
    from transformers import PreTrainedTokenizerFast

    from tests.support.sentences import SENTENCES
    from tests.support.text_models import train_qwen_style_bpe

    bpe = train_qwen_style_bpe(list(SENTENCES) * 2, 900)
    bpe.add_special_tokens(VLM_SPECIAL_TOKENS[3:])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        padding_side="left", model_max_length=32768)
    tokenizer.chat_template = QWEN2_VL_CHAT_TEMPLATE
    return tokenizer


#: the layouts built here: model_type → (processor class, the class whose weights are saved)
FAMILIES = {"qwen2_vl": ("Qwen2VLProcessor", "Qwen2VLForConditionalGeneration"),
            "qwen2_5_vl": ("Qwen2_5_VLProcessor", "Qwen2_5_VLForConditionalGeneration"),
            "qwen3_vl": ("Qwen3VLProcessor", "Qwen3VLForConditionalGeneration")}


def build_processor(out: Path, processor_class: str = "Qwen2VLProcessor", *, patch: int = 14, mean=None, std=None):
    """Qwen2-VL's processor files as Qwen2-VL-Instruct (and GME) publish them: ``preprocessor_config.json`` naming
    ``Qwen2VLImageProcessor`` with ``min_pixels``/``max_pixels``, ``chat_template.json``, the tokenizer. Returns
    the tokenizer."""
    import json

    tokenizer = build_tokenizer(out)
    tokenizer.save_pretrained(str(out))
    token = (patch * 2) ** 2  # the pixels of one merged token (2×2 patches)
    (out / "preprocessor_config.json").write_text(json.dumps({
        "min_pixels": MIN_TOKENS * token, "max_pixels": MAX_TOKENS * token, "patch_size": patch,
        "temporal_patch_size": 2, "merge_size": 2, "image_mean": mean or [0.48145466, 0.4578275, 0.40821073],
        "image_std": std or [0.26862954, 0.26130258, 0.27577711], "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": processor_class}, indent=2))
    (out / "chat_template.json").write_text(json.dumps({"chat_template": QWEN2_VL_CHAT_TEMPLATE}, indent=2))
    (out / "chat_template.jinja").unlink(missing_ok=True)  # the template travels in chat_template.json only
    return tokenizer


def build_qwen2_vl(out: Path, *, family: str = "qwen2_vl") -> None:
    """A tiny Qwen2-VL (GME-Qwen2-VL's layout) or Qwen2.5-VL with its processor files, the weights of its
    ``*ForConditionalGeneration`` class saved by transformers (as GME publishes them)."""
    import torch
    import transformers

    processor_class, architecture = FAMILIES[family]
    if family == "qwen3_vl":  # Qwen3-VL's image processing: 16 px patches, mean and std 0.5
        tok = build_processor(out, processor_class, patch=16, mean=[0.5] * 3, std=[0.5] * 3)
    else:
        tok = build_processor(out, processor_class)
    ids = {t: tok.convert_tokens_to_ids(t) for t in VLM_SPECIAL_TOKENS}
    torch.manual_seed(91)
    vision = dict(depth=2, num_heads=4, patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                  initializer_range=0.2)
    if family == "qwen2_vl":
        vision.update(embed_dim=32, hidden_size=64)
        config_class = transformers.Qwen2VLConfig
    elif family == "qwen2_5_vl":  # windowed attention in the first block (56 px windows: 2×2 merged tokens)
        vision.update(hidden_size=32, intermediate_size=64, out_hidden_size=64, window_size=56,
                      fullatt_block_indexes=[1])
        config_class = transformers.Qwen2_5_VLConfig
    else:  # Qwen3-VL: 16 px patches, learned positions interpolated per image, a deepstack layer
        vision.update(hidden_size=32, intermediate_size=64, out_hidden_size=64, patch_size=16,
                      num_position_embeddings=64, deepstack_visual_indexes=[0])
        config_class = transformers.Qwen3VLConfig
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
                initializer_range=0.2, pad_token_id=ids["<|endoftext|>"])
    if family == "qwen3_vl":
        text.update(head_dim=16, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                                                  "mrope_interleaved": True, "rope_theta": 10000.0})
    else:
        text.update(bos_token_id=None, eos_token_id=ids["<|im_end|>"])
    config = config_class(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    getattr(transformers, architecture)(config).eval().save_pretrained(str(out))


def gme_folder(family: str = "qwen2_vl") -> Path:
    """The tiny folder of a layout (``qwen2_vl``: GME-Qwen2-VL's), built once per content of the builders (cached
    under .venv/test-cache)."""
    from functools import partial

    from tests.support import text_models
    from tests.support.cache import cached_build

    return cached_build(f"tiny-gme-{family.replace('_', '-')}", [Path(__file__), Path(text_models.__file__)],
                        partial(build_qwen2_vl, family=family))
