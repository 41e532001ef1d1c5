"""Every input check of the serving layer, whatever the wire shape: the ``input`` unions, document lists,
label choices, and the server's limits (items, characters, prompt)."""

from __future__ import annotations

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


def check_late_chunking(texts: Sequence[str] | None, late: Any, settings: Settings) -> None:
    """Late chunking embeds one context: its chunks joined by the separator (which counts toward every
    character limit, as the context is tokenized whole), or one text with spans (each span an item)."""
    if late is None or texts is None:
        return
    if late.spans is not None:
        check_count(len(late.spans), settings, "late_chunking.spans")
        return
    chars = sum(map(len, texts)) + len(late.separator) * max(0, len(texts) - 1)
    limit = settings.max_chars_per_item
    if chars > limit:
        raise TooLarge(f"late_chunking: the {len(texts)} chunks joined by the {len(late.separator)}-character "
                       f"separator make a {chars}-character context, tokenized as one text; the limit is {limit}",
                       param="late_chunking")


def text_list(value: str | list[str], param: str, settings: Settings) -> list[str]:
    texts = [value] if isinstance(value, str) else list(value)
    not_empty(texts, param)
    return check_texts(texts, settings, param)


def document_texts(documents: Sequence[Any] | None, settings: Settings, param: str = "documents") -> list[str]:
    """Documents as strings, or objects with a string ``text`` field (Cohere/Infinity)."""
    if documents is None:
        raise InvalidInput(f"'{param}' is required", param=param)
    not_empty(documents, param)
    texts = []
    for i, doc in enumerate(documents):
        if isinstance(doc, str):
            texts.append(doc)
        elif isinstance(doc, dict) and isinstance(doc.get("text"), str):
            texts.append(doc["text"])
        else:
            raise InvalidInput(f"{param}[{i}] must be a string or an object with a string 'text' field", param=param)
    return check_texts(texts, settings, param)


def not_empty(value: Sequence[Any] | None, param: str) -> None:
    if not value:
        raise InvalidInput(f"'{param}' must not be empty", param=param)


def embedding_input(value: Any, settings: Settings, param: str = "input",
                    prompt: str | None = None) -> tuple[list[str] | None, list[list[int]] | None]:
    """The OpenAI ``input`` union (a string, strings, a token-id list, token-id lists) → (texts, token_ids),
    within the limits (a literal ``prompt`` counts toward them: it is prepended to every text)."""
    if isinstance(value, str):
        texts = [value]
    elif not value:
        raise InvalidInput(f"'{param}' must not be empty", param=param)
    elif isinstance(value[0], str):
        texts = list(value)
    else:
        token_ids = [value] if isinstance(value[0], int) else value
        check_count(len(token_ids), settings, param)
        return None, token_ids
    check_texts(texts, settings, param)
    check_prompt(prompt, texts, settings)
    return texts, None


def media_refs(value: Any, modality: str, settings: Settings, param: str = "input") -> list[str]:
    """``modality: image | audio``: ``input`` holds data: URIs or http(s) URLs."""
    refs = [value] if isinstance(value, str) else value
    not_empty(refs, param)
    for i, ref in enumerate(refs):
        if not isinstance(ref, str):
            raise InvalidInput(f"{param}[{i}]: {modality} input must be a data: URI or an http(s) URL string",
                               param=param)
    check_count(len(refs), settings, param)
    return list(refs)


def label_columns(asked: Sequence[str] | None, labels: Sequence[str]) -> list[int]:
    """The label columns a classify request asks for (all, in the model's order, when None)."""
    if asked is None:
        return list(range(len(labels)))
    not_empty(asked, "labels")
    unknown = [lab for lab in asked if lab not in labels]
    if unknown:
        raise InvalidInput(f"unknown labels {unknown}; this model's labels: {list(labels)}", param="labels",
                           code="unknown_label")
    return [list(labels).index(lab) for lab in dict.fromkeys(asked)]


def predict_inputs(value: Any) -> tuple[list[str] | None, list[tuple[str, str]] | None, bool]:
    """TEI's /predict ``inputs``: a string; a [text, text_pair] pair; or a batch of strings or pairs.
    Returns (texts, pairs, single)."""
    if isinstance(value, str):
        return [value], None, True
    not_empty(value, "inputs")
    if all(isinstance(v, str) for v in value):
        if len(value) == 2:  # TEI reads a two-string list as one (text, text_pair)
            return None, [(value[0], value[1])], True
        return list(value), None, False
    if all(isinstance(v, list) for v in value):
        pairs = []
        for i, v in enumerate(value):
            if len(v) == 1:
                pairs.append((v[0], None))
            elif len(v) == 2:
                pairs.append((v[0], v[1]))
            else:
                raise InvalidInput(f"inputs[{i}] must be [text] or [text, text_pair]", param="inputs")
        if all(b is None for _, b in pairs):
            return [a for a, _ in pairs], None, False
        if any(b is None for _, b in pairs):
            raise InvalidInput("inputs: mix of single texts and pairs in one batch", param="inputs")
        return None, pairs, False
    raise InvalidInput("inputs: expected a string, a [text, text_pair] pair, or a list of them", param="inputs")


def check_positive(value: int | None, param: str) -> None:
    if value is not None and value <= 0:
        raise InvalidInput(f"'{param}' must be a positive integer, got {value}", param=param)


TRUNCATION_DIRECTIONS = ("right", "left")


def truncation_direction(value: str | None, task: Any) -> str:
    """``right`` (keep the start; the default) or ``left`` (keep the end), for tasks that can."""
    direction = (value or "right").lower()
    if direction not in TRUNCATION_DIRECTIONS:
        raise InvalidInput(f"truncation_direction must be 'left' or 'right', got {value!r}",
                           param="truncation_direction")
    if direction == "left" and not task.truncates_left:
        raise InvalidInput(f"truncation_direction 'left' is not offered by the {task.name} task",
                           param="truncation_direction")
    return direction


CHAT_ROLES = ("system", "user", "assistant")


def chat_messages(messages: Any, settings: Settings, *, add_generation_prompt: bool,
                  continue_final_message: bool) -> tuple[Any, list[str]]:
    """``messages`` (vLLM's chat embeddings: one conversation, ``[{role, content}]``, content a string or parts
    ``{"type": "text", "text"}`` / ``{"type": "image_url", "image_url": {"url"}}``) → the task's conversation and
    its image references, in order. The limits apply: images count as items (``max_items_per_request``), the
    conversation's text as one item's characters (``max_chars_per_item``)."""
    from core.tasks.vlm_embed import Conversation

    param = "messages"
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("'messages' must be a non-empty list of {role, content} objects", param=param)
    if add_generation_prompt and continue_final_message:
        raise InvalidInput("add_generation_prompt and continue_final_message cannot both be true: the first opens "
                           "a new assistant turn, the second continues the last message", param=param)
    check_count(len(messages), settings, param)
    turns, refs, chars = [], [], 0
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or set(message) - {"role", "content", "name"}:
            raise InvalidInput(f"{where} must be an object with 'role' and 'content'", param=param)
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise InvalidInput(f"{where}.role must be one of {list(CHAT_ROLES)}, got {role!r}", param=param)
        if isinstance(content, str):
            chars += len(content)
            turns.append({"role": role, "content": content})
            continue
        if not isinstance(content, list) or not content:
            raise InvalidInput(f"{where}.content must be a string or a non-empty list of parts", param=param)
        parts = []
        for j, part in enumerate(content):
            at = f"{where}.content[{j}]"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                chars += len(part["text"])
                parts.append({"type": "text", "text": part["text"]})
            elif kind == "image_url":
                image = part.get("image_url")
                url = image.get("url") if isinstance(image, dict) else None
                if not isinstance(url, str) or not url:
                    raise InvalidInput(f"{at}: an image_url part is {{\"type\": \"image_url\", \"image_url\": "
                                       "{\"url\": \"data:... or https://...\"}}", param=param)
                parts.append({"type": "image", "index": len(refs)})
                refs.append(url)
            else:
                raise InvalidInput(f"{at}: expected {{\"type\": \"text\", \"text\": ...}} or {{\"type\": "
                                   f"\"image_url\", \"image_url\": {{\"url\": ...}}}}; got type {kind!r}", param=param)
        turns.append({"role": role, "content": parts})
    if chars > settings.max_chars_per_item:
        raise TooLarge(f"the messages hold {chars} characters of text; the limit is {settings.max_chars_per_item}",
                       param=param)
    check_count(len(refs), settings, param)
    return Conversation(turns, add_generation_prompt=add_generation_prompt,
                        continue_final_message=continue_final_message), refs
