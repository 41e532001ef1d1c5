"""``/v1/models``' answer."""

from __future__ import annotations


def model_list(cards: list[dict], frontends: dict | None = None) -> dict:
    """OpenAI's list; ``frontends``: ``{"count": N, "reason": "..."}``, the server's front-end processes."""
    answer = {"object": "list", "data": cards}
    if frontends is not None:
        answer["frontends"] = frontends
    return answer
