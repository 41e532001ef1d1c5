"""Token answers: ``/v1/tokenize``'s list and TEI's ``/tokenize``."""

from __future__ import annotations

from core.api.common import usage
from core.serving import Served


def token_list(served: Served) -> dict:
    """``/v1/tokenize``: ids, token strings and counts per text."""
    rows = served.result
    data = [{"object": "tokens", "index": i, "ids": [p.id for p in row], "tokens": [p.text for p in row],
             "count": len(row)} for i, row in enumerate(rows)]
    tokenizer = served.engine.task.tokenizer
    return {"object": "list", "data": data, "model": served.engine.name, "max_length": tokenizer.max_length,
            "usage": usage(sum(len(row) for row in rows))}


def tei_tokens(served: Served) -> list:
    return [[{"id": p.id, "text": p.text, "special": p.special, "start": p.start, "stop": p.stop} for p in row]
            for row in served.result]
