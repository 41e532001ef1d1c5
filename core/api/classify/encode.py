"""Classification answers: Infinity's ``/v1/classify`` shape and TEI's ``/predict``."""

from __future__ import annotations

import numpy as np

from core.api.common import ranked, response_id, usage
from core.serving import Served


def classify_list(served: Served, columns: list[int], top_k: int | None) -> dict:
    """Infinity's classify shape: per input, ``{label, score}`` best first, over the columns asked for."""
    labels = served.engine.task.labels
    sub = np.asarray(columns)
    data = []
    for row in served.result.scores:
        order = sub[np.argsort(-row[sub], kind="stable")].tolist()
        if top_k is not None:
            order = order[:top_k]
        data.append([{"label": labels[j], "score": float(row[j])} for j in order])
    rid, created = response_id("classify")
    return {"object": "classify", "id": rid, "created": created, "data": data, "model": served.engine.name,
            "usage": usage(served.result.prompt_tokens)}


def tei_predict(served: Served, single: bool) -> list:
    labels = served.result.labels
    out = [[{"score": float(row[j]), "label": labels[j]} for j in ranked(row)] for row in served.result.scores]
    return out[0] if single else out
