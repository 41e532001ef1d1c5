"""The text log format: its time is logging's own default, also where it is formatted once per second. The
access line written directly is the line its record gives, and a loop turn's access lines go out in one write."""

from __future__ import annotations

import asyncio
import io
import logging
import time

import pytest

from core.api.observability import Observability, access_log
from core.logs import TEXT_FORMAT, JsonFormatter, OwnHandler, TextFormatter, sole_handler
from core.request_context import RequestRecord


def _record(created: float) -> logging.LogRecord:
    record = logging.LogRecord("tessera.access", logging.INFO, __file__, 1, "POST %s", ("/v1/embeddings",), None)
    record.created, record.msecs = created, (created - int(created)) * 1000
    return record


def test_the_time_reads_as_loggings_default_within_a_second_and_across_seconds():
    ours, plain = TextFormatter(TEXT_FORMAT), logging.Formatter(TEXT_FORMAT)
    # within one second, across a second, across a day, and back (out of order, as threads may log)
    for created in (1_765_000_000.001, 1_765_000_000.999, 1_765_000_001.5, 1_765_086_400.25, 1_765_000_000.5):
        record = _record(created)
        assert ours.format(record) == plain.format(record)


def test_a_date_format_of_its_own_is_used_as_given():
    ours = TextFormatter(TEXT_FORMAT, datefmt="%H:%M:%S")
    record = _record(1_765_000_000.25)
    assert ours.formatTime(record, "%H:%M:%S") == logging.Formatter(TEXT_FORMAT).formatTime(record, "%H:%M:%S")


# ---- the access line written without a LogRecord ------------------------------------------------------------

class _PlainRecord(logging.LogRecord):
    """A record factory of someone else's: the access line then takes logging's own path."""


@pytest.fixture
def own_handler_only(monkeypatch):
    """A function that leaves the root logger with nothing but a handler of ``configure_logging``'s kind, writing
    to a buffer, at a fixed time (called in the test itself: pytest adds its log capture to the root's handlers
    when the test starts, and takes it away after)."""
    root = logging.getLogger()
    level = root.level

    def only() -> tuple[OwnHandler, io.StringIO]:
        stream = io.StringIO()
        handler = OwnHandler(stream)
        monkeypatch.setattr(root, "handlers", [handler])
        root.setLevel(logging.INFO)
        monkeypatch.setattr(time, "time", lambda: 1_765_000_000.0421)
        return handler, stream

    yield only
    root.setLevel(level)


def _access_line(stream: io.StringIO) -> str:
    scope = {"method": "POST", "path": "/v1/embeddings\r\nforged", "route": None}
    record = RequestRecord("0123abcd", model="bench", inputs=3, tokens=41, error_code=None, cache_hits=1, cache_misses=2)
    Observability._log(scope, scope["path"], record, 200, 0.01234)
    line = stream.getvalue()
    stream.seek(0)
    stream.truncate()
    return line


@pytest.mark.parametrize("formatter", [TextFormatter(TEXT_FORMAT), JsonFormatter()], ids=["text", "json"])
def test_the_access_line_written_directly_is_the_line_its_record_gives(own_handler_only, formatter, monkeypatch):
    handler, stream = own_handler_only()
    handler.setFormatter(formatter)
    assert sole_handler(access_log, logging.INFO) is handler
    direct = _access_line(stream)
    monkeypatch.setattr(logging, "_logRecordFactory", _PlainRecord)  # logging.setLogRecordFactory, undone after
    assert sole_handler(access_log, logging.INFO) is None
    through_logging = _access_line(stream)
    assert direct == through_logging
    assert direct.count("\n") == 1 and "forged" in direct and "\r" not in direct  # one line, its controls escaped
    assert "cache_hits" in direct and "0123abcd" in direct


def test_the_access_line_takes_loggings_path_while_anyone_else_listens(own_handler_only, caplog):
    handler, stream = own_handler_only()
    handler.setFormatter(TextFormatter(TEXT_FORMAT))
    assert sole_handler(access_log, logging.INFO) is handler
    logging.getLogger().addHandler(caplog.handler)  # a second handler on the root: a capture, an exporter
    try:
        assert sole_handler(access_log, logging.INFO) is None
        caplog.clear()
        line = _access_line(stream)
        assert [r.getMessage() for r in caplog.records if r.name == "tessera.access"] == ["POST unmatched 200"]
        assert line.startswith("2025-12-0") and line.rstrip().endswith("cache_misses=2")
    finally:
        logging.getLogger().removeHandler(caplog.handler)
    for blocker in (logging.Filter("nobody"),):
        access_log.addFilter(blocker)
        try:
            assert sole_handler(access_log, logging.INFO) is None
        finally:
            access_log.removeFilter(blocker)


class _CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def test_a_loop_turns_access_lines_go_out_in_one_write_and_nothing_overtakes_them():
    stream = _CountingStream()
    handler = OwnHandler(stream)
    handler.setFormatter(TextFormatter("%(message)s"))

    async def main() -> None:
        for i in range(5):
            handler.write_line(f"line {i}")
        assert stream.getvalue() == ""  # held to the end of this turn of the loop
        await asyncio.sleep(0)
        assert stream.getvalue() == "".join(f"line {i}\n" for i in range(5)) and stream.writes == 1

        handler.write_line("held")
        handler.handle(_record(1_765_000_000.0))  # a record logged meanwhile writes the held line first
        assert stream.getvalue().splitlines()[-2:] == ["held", "POST /v1/embeddings"]
        handler.write_line("flushed")
        handler.flush()  # logging's shutdown flushes every handler: nothing held is lost
        assert stream.getvalue().splitlines()[-1] == "flushed"
        await asyncio.sleep(0)  # the turn's scheduled write finds nothing left to write
        assert stream.getvalue().count("flushed") == 1

    asyncio.run(main())
    writes = stream.writes
    handler.write_line("no loop")  # no loop on this thread: written at once
    assert stream.getvalue().endswith("no loop\n") and stream.writes == writes + 1


def test_lines_held_for_a_loop_that_stopped_before_its_turn_ended_go_out_with_the_next_loops_turn():
    """A loop stopped within the turn that held a line never runs that turn's write: the next line, on another
    loop, is written at the end of that loop's turn with it (not held until some record or flush comes)."""
    stream = _CountingStream()
    handler = OwnHandler(stream)
    first = asyncio.new_event_loop()
    first.call_soon(lambda: (handler.write_line("held when the loop stopped"), first.stop()))
    first.run_forever()
    first.close()
    assert stream.getvalue() == ""

    async def main() -> None:
        handler.write_line("the next line")
        await asyncio.sleep(0)

    asyncio.run(main())
    assert stream.getvalue() == "held when the loop stopped\nthe next line\n" and stream.writes == 1
