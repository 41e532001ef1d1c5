"""Scores: cross-encoder rerank, late-interaction MaxSim against a query, and a classifier's labels."""

from __future__ import annotations

from typing import Any

from core.capabilities import Capability
from core.serving.context import Served, ServingContext
from core.serving.inputs import (
    check_positive,
    check_texts,
    document_texts,
    label_columns,
    predict_inputs,
    text_list,
    truncation_direction,
)
from core.tasks.classify import ClassifyRequest
from core.tasks.late_interaction import MaxSimRequest
from core.tasks.rerank import RerankRequest


async def rerank(serving: ServingContext, model: str | None, query: str, documents: Any, *, deadline: float,
                 raw_scores: bool = False, truncate: bool = True, max_tokens_per_doc: int | None = None,
                 top_n: int | None = None, direction: str | None = None,
                 param: str = "documents", instruction: str | None = None) -> tuple[Served, list[str]]:
    """Scores of ``documents`` (strings or ``{text}`` objects) against ``query``, in input order; also
    the documents' texts (for the encoders that return them)."""
    engine = serving.engine(model, Capability.RERANK)
    truncation_direction(direction, engine.task)  # pairs lose document tokens first: "left" is refused
    texts = document_texts(documents, serving.settings, param)
    check_positive(top_n, "top_n")
    check_positive(max_tokens_per_doc, "max_tokens_per_doc")
    task_request = RerankRequest(query=query, documents=texts, raw_scores=raw_scores, truncate=truncate,
                                 max_tokens_per_doc=max_tokens_per_doc, instruction=instruction)
    return Served(engine, await engine(task_request, deadline=deadline)), texts


async def maxsim(serving: ServingContext, model: str | None, query: str, documents: Any, *, truncate: bool,
                deadline: float) -> Served:
    """``/v1/score``: MaxSim of each document against the query, in input order."""
    engine = serving.engine(model, Capability.SCORE)
    texts = document_texts(documents, serving.settings)
    return Served(engine, await engine(MaxSimRequest(query=query, documents=texts, truncate=truncate),
                                       deadline=deadline))


async def classify(serving: ServingContext, model: str | None, inputs: Any, *, deadline: float,
                   labels: list[str] | None = None, top_k: int | None = None, raw_scores: bool = False,
                   truncate: bool = True, direction: str | None = None) -> tuple[Served, list[int]]:
    """``/v1/classify``: per input the label scores; also the label columns asked for."""
    engine = serving.engine(model, Capability.CLASSIFY)
    texts = text_list(inputs, "input", serving.settings)
    check_positive(top_k, "top_k")
    columns = label_columns(labels, engine.task.labels)
    task_request = ClassifyRequest(texts=texts, raw_scores=raw_scores, truncate=truncate,
                                   truncation_direction=truncation_direction(direction, engine.task))
    return Served(engine, await engine(task_request, deadline=deadline)), columns


async def predict(serving: ServingContext, model: str | None, inputs: Any, *, deadline: float, raw_scores: bool = False,
                  truncate: bool = True, direction: str | None = None) -> tuple[Served, bool]:
    """TEI's ``/predict``: single texts or (text, text_pair) pairs; also whether one input was sent."""
    engine = serving.engine(model, Capability.CLASSIFY)
    texts, pairs, single = predict_inputs(inputs)
    check_texts(texts if texts is not None else [t for pair in pairs for t in pair], serving.settings, "inputs")
    task_request = ClassifyRequest(texts=texts, pairs=pairs, raw_scores=raw_scores, truncate=truncate,
                                   truncation_direction=truncation_direction(direction, engine.task))
    return Served(engine, await engine(task_request, deadline=deadline)), single
