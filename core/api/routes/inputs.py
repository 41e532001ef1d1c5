"""Input checks shared by the text-task routes (not a router): document lists, limits, top-n."""

from __future__ import annotations

import time
import uuid
from typing import Any, Sequence

from core.config import Settings
from core.errors import InvalidInput, TooLarge


def check_count(count: int, settings: Settings, param: str) -> None:
    """The server's limit of items per request."""
    if count > settings.max_items_per_request:
        raise TooLarge(f"{count} inputs in one request; the limit is {settings.max_items_per_request}", param=param)


def check_texts(texts: Sequence[str], settings: Settings, param: str) -> list[str]:
    """Limits of the server (items per request, characters per item)."""
    check_count(len(texts), settings, param)
    limit = settings.max_chars_per_item
    for i, text in enumerate(texts):
        if len(text) > limit:
            raise TooLarge(f"{param}[{i}] has {len(text)} characters; the limit is {limit}", param=param)
    return list(texts)


def check_prompt(prompt: str | None, texts: Sequence[str], settings: Settings) -> None:
    """A literal prompt is prepended to every text: it counts toward each item's characters and, once per
    text, toward the request's (at most a body's worth of text is tokenized per request)."""
    if not prompt:
        return
    longest = max(range(len(texts)), key=lambda i: len(texts[i]), default=None)
    if longest is not None and len(prompt) + len(texts[longest]) > settings.max_chars_per_item:
        raise TooLarge(f"prompt + input[{longest}] has {len(prompt) + len(texts[longest])} characters; the limit "
                       f"is {settings.max_chars_per_item}", param="prompt")
    total = len(prompt) * len(texts) + sum(map(len, texts))
    if total > settings.max_request_bytes:
        raise TooLarge(f"the prompt repeated over {len(texts)} inputs makes {total} characters to tokenize; the "
                       f"limit per request is {settings.max_request_bytes}", param="prompt")


def text_list(value: str | list[str], param: str, settings: Settings) -> list[str]:
    texts = [value] if isinstance(value, str) else list(value)
    if not texts:
        raise InvalidInput(f"'{param}' must not be empty", param=param)
    return check_texts(texts, settings, param)


def document_texts(documents: Sequence[Any] | None, settings: Settings, param: str = "documents") -> list[str]:
    """Documents as strings, or objects with a string ``text`` field (Cohere/Infinity)."""
    if documents is None:
        raise InvalidInput(f"'{param}' is required", param=param)
    if not documents:
        raise InvalidInput(f"'{param}' must not be empty", param=param)
    texts = []
    for i, doc in enumerate(documents):
        if isinstance(doc, str):
            texts.append(doc)
        elif isinstance(doc, dict) and isinstance(doc.get("text"), str):
            texts.append(doc["text"])
        else:
            raise InvalidInput(f"{param}[{i}] must be a string or an object with a string 'text' field", param=param)
    return check_texts(texts, settings, param)


def check_positive(value: int | None, param: str) -> None:
    if value is not None and value <= 0:
        raise InvalidInput(f"'{param}' must be a positive integer, got {value}", param=param)


def response_id(kind: str) -> tuple[str, int]:
    return f"{kind}-{uuid.uuid4().hex}", int(time.time())
