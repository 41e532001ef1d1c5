"""JSON Lines mini-batches, as SageMaker Batch Transform sends them.

With ``SplitType=Line`` and ``BatchStrategy=MultiRecord`` the container receives several records in
one ``POST /invocations`` (``Content-Type: application/jsonlines``), one JSON document per line, and
with ``AssembleWith=Line`` SageMaker writes the answer's lines to the output object in order, so the
answer must hold exactly one line per record, in the records' order.

Each record is one request body of the target route (e.g. ``{"input": "a document"}`` or
``{"input": ["a", "b"]}`` for embeddings) and runs as its own request; the records of a mini-batch run
concurrently (at most ``concurrency`` at a time), so the dynamic batcher merges them into model batches.
A record that fails (not JSON, invalid for the route, too long...) answers, on its own line, the error
object the HTTP API would have answered (``{"error": {message, type, param, code}}``), so the other
records' lines neither sink nor shift; the mini-batch as a whole answers 200. A record refused for
overload (429: the model's queue is full, which a mini-batch of many large records can cause by
itself) is retried after a short wait, for up to ``retry_for_s``, instead of answering an error line. An empty line inside the
body is a record too (it answers an error line); only the newline that ends the body does not start one.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import orjson

JSONLINES_TYPES = frozenset({"application/jsonlines", "application/jsonl", "application/x-jsonlines",
                             "application/json-lines"})
JSONLINES = "application/jsonlines"
DEFAULT_CONCURRENCY = 64
#: statuses that mean "later", not "never": retried within the mini-batch
RETRY_STATUSES = frozenset({429})

#: one record's body → (HTTP status, the answer's bytes)
RunRecord = Callable[[bytes], Awaitable[tuple[int, bytes]]]


def split_records(body: bytes) -> list[bytes]:
    """The body's lines (``\\n`` or ``\\r\\n``); a final newline ends the last record, it starts none."""
    if not body:
        return []
    lines = body.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line[:-1] if line.endswith(b"\r") else line for line in lines]


def error_line(message: str, code: str, *, type: str = "invalid_request_error") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": None, "code": code}})


def as_line(status: int, answer: bytes) -> bytes:
    """One record's answer on a single line. The app's answers are compact JSON documents (orjson writes no
    newline) and are kept as they are; anything else is re-encoded compactly, and a body that is not JSON
    (should not happen) becomes an error line naming the status."""
    if answer[:1] in (b"{", b"[") and b"\n" not in answer and b"\r" not in answer:
        return answer
    try:
        return orjson.dumps(orjson.loads(answer))
    except orjson.JSONDecodeError:
        return error_line(f"record answered {status} without a JSON body", "internal_error", type="server_error")


def assemble(lines: list[bytes]) -> bytes:
    """``AssembleWith=Line``: each record's line, each ended by a newline."""
    return b"".join(line + b"\n" for line in lines)


async def run_records(records: list[bytes], run: RunRecord, *, concurrency: int = DEFAULT_CONCURRENCY,
                      retry_for_s: float = 30.0, first_wait_s: float = 0.05) -> tuple[list[bytes], int]:
    """Run every record through ``run``; returns (one line per record, in order; how many failed)."""
    gate = asyncio.Semaphore(max(1, concurrency))
    failed = 0
    loop = asyncio.get_running_loop()

    async def one(record: bytes) -> bytes:
        nonlocal failed
        give_up = loop.time() + retry_for_s
        wait = first_wait_s
        while True:
            async with gate:
                status, answer = await run(record)
            if status not in RETRY_STATUSES or loop.time() + wait > give_up:
                break
            await asyncio.sleep(wait)  # outside the gate: the records ahead of it make progress
            wait = min(wait * 2, 1.0)
        if status >= 400:
            failed += 1
        return as_line(status, answer)

    lines = await asyncio.gather(*(one(record) for record in records))
    return list(lines), failed
