"""``/v1/score``'s answer: one score per document, in input order."""

from __future__ import annotations

from core.api.common import usage
from core.serving import Served


def score_list(served: Served) -> dict:
    data = [{"object": "score", "index": i, "score": float(s)} for i, s in enumerate(served.result.scores)]
    return {"object": "list", "data": data, "model": served.engine.name, "usage": usage(served.result.prompt_tokens)}
