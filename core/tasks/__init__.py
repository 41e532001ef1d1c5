"""Task modules, one per task. ``create_task`` is the one place that maps a task name to its class."""

from __future__ import annotations

import importlib

from core.errors import InvalidInput

TASKS: dict[str, tuple[str, str]] = {
    "embed": ("core.tasks.embed", "EmbedTask"),
    "clip": ("core.tasks.clip", "ClipTask"),
    "clap": ("core.tasks.clap", "ClapTask"),
    "colpali": ("core.tasks.colpali", "ColPaliTask"),
    "vlm_embed": ("core.tasks.vlm_embed", "VlmEmbedTask"),
    "rerank": ("core.tasks.rerank", "RerankTask"),
    "llm_rerank": ("core.tasks.llm_rerank", "LlmRerankTask"),
    "classify": ("core.tasks.classify", "ClassifyTask"),
    "sparse": ("core.tasks.sparse", "SparseTask"),
    "late_interaction": ("core.tasks.late_interaction", "LateInteractionTask"),
    "multi_output": ("core.tasks.multi_output", "MultiOutputTask"),
}


def task_class(name: str) -> type:
    if name not in TASKS:
        raise InvalidInput(f"unknown task {name!r}; known: {sorted(TASKS)}")
    module, cls = TASKS[name]
    return getattr(importlib.import_module(module), cls)


def create_task(name: str, info, spec):
    from core.loading import is_causal_lm

    if name == "rerank" and is_causal_lm(info):  # a causal LM reranks by its next-token logits ("yes"/"no")
        name = "llm_rerank"
    return task_class(name)(info, spec)
