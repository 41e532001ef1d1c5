"""``/v1/models``' answer."""

from __future__ import annotations


def model_list(cards: list[dict]) -> dict:
    return {"object": "list", "data": cards}
