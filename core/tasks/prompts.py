"""Prompts / instructions (sentence-transformers semantics): a named prompt or a literal one is prepended to
each text; usage counts its tokens; with the Pooling module's ``include_prompt: false`` its tokens are left
out of pooling."""

from __future__ import annotations

from core.config import ModelSpec
from core.errors import InvalidInput
from core.loading import ModelInfo


def model_prompts(info: ModelInfo, spec: ModelSpec) -> dict[str, str]:
    """The folder's prompts (config_sentence_transformers.json) with the spec's settings on top."""
    return {**info.prompts, **spec.prompts}


def resolve_prompt(info: ModelInfo, spec: ModelSpec, prompt: str | None, prompt_name: str | None) -> str | None:
    """The prompt text a request uses. As in sentence-transformers, a literal ``prompt`` wins over
    ``prompt_name``; with neither, the default prompt (spec, else folder) applies, if any."""
    if prompt is not None:
        return prompt or None
    prompts = model_prompts(info, spec)
    if prompt_name is None:
        prompt_name = spec.default_prompt_name or info.default_prompt_name
        if prompt_name is None:
            return None
    if prompt_name not in prompts:
        known = sorted(prompts) or "none"
        raise InvalidInput(
            f"unknown prompt_name {prompt_name!r}; this model's prompts: {known}", param="prompt_name",
            code="unknown_prompt",
        )
    return prompts[prompt_name] or None
