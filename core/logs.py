"""Logging set-up for the process entry points. Request text and media are never logged.

``fmt="text"`` (the default) writes ``time level logger: message``; ``fmt="json"`` writes every line as
one JSON object (:class:`JsonFormatter`), uvicorn's own loggers included. Lines logged while a request
is in progress carry its ``request_id``; the access line (logger ``tessera.access``, one per request)
carries its fields in the record's ``fields`` (see ``core.api.observability``). Where nothing but this module's
own handler listens (:func:`sole_handler`), the access line is written as that handler would write its record,
without making one (``line`` of each formatter), and a loop turn's access lines go out in one write
(:class:`OwnHandler`)."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import re
import sys
import time
import traceback
from typing import Any

from core import request_context

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: the loggers of uvicorn, which set up handlers of their own unless told not to
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")

#: level names other runtimes use (AWS Lambda's ``AWS_LAMBDA_LOG_LEVEL``: TRACE, WARN, FATAL) → Python's
_ALIASES = {"TRACE": "DEBUG", "WARN": "WARNING", "FATAL": "CRITICAL"}


def level_number(level: str) -> int:
    """``info``, ``WARN``, ``TRACE``... as a ``logging`` level (INFO for a name that is not one)."""
    name = _ALIASES.get(level.strip().upper(), level.strip().upper())
    number = logging.getLevelName(name)
    return number if isinstance(number, int) else logging.INFO


def configure_logging(level: str = "info", *, fmt: str = "text") -> None:
    """Log at ``level``. Where the host process already put a handler on the root logger before our
    code ran (AWS Lambda's runtime interface client does, with its own text or JSON format), that
    handler and its format are kept and only the level is set (in text format). ``fmt="json"`` puts
    :class:`JsonFormatter` on the root logger and takes uvicorn's loggers over."""
    root = logging.getLogger()
    if fmt != "json" and root.handlers:
        root.setLevel(level_number(level))
        return
    if fmt == "json":
        handler = OwnHandler()
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=_level(level), handlers=[handler], force=True)
    else:
        handler = OwnHandler()
        handler.setFormatter(TextFormatter(TEXT_FORMAT))
        logging.basicConfig(level=_level(level), handlers=[handler])  # as before: a configured root is kept
    _take_over_uvicorn()


def _take_over_uvicorn() -> None:
    """uvicorn's lines in our format, from the first one: a server that configured its loggers before us
    (``uvicorn core.dev:app``) gets ours instead. Its access line goes: ``tessera.access`` logs each request
    once (or, with ``access_log`` off, nothing does)."""
    for name in UVICORN_LOGGERS:
        uvicorn_logger = logging.getLogger(name)
        if name == "uvicorn.access":
            uvicorn_logger.handlers.clear()
            uvicorn_logger.propagate = False
            uvicorn_logger.disabled = True
        elif uvicorn_logger.handlers:
            uvicorn_logger.handlers.clear()
            uvicorn_logger.propagate = True


def uvicorn_log_options(fmt: str) -> dict[str, Any]:
    """``uvicorn.run`` keywords: uvicorn keeps its hands off logging, in either format (its loggers go
    through :func:`configure_logging`'s handler: one format from the first line)."""
    return {"log_config": None}


def _level(level: str) -> int:
    return level_number(level)


#: what would end or rewrite a text log line: C0/C1 controls, DEL and Unicode's line/paragraph separators
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escape_control(match: re.Match) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def escape_controls(text: str) -> str:
    """``text`` with each control character written as its escape (``\\r``, ``\\x1b``, ``\\u2028``): a
    value from a request (a path, a header) can then never start a line of its own in a text log."""
    return _CONTROL.sub(_escape_control, text)


class TextFormatter(logging.Formatter):
    """The text format, with a record's ``fields`` appended as ``key=value``. The message and every field
    are written with their control characters escaped (:func:`escape_controls`); a traceback follows as is.
    The time is logging's own default format, its date and time of day formatted once per second."""

    _stamp: tuple[int, str] = (-1, "")  # (the second, its formatted date and time)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None or not self.default_msec_format:
            return super().formatTime(record, datefmt)
        return self._time(record.created, record.msecs)

    def _time(self, created: float, msecs: float) -> str:
        second, text = self._stamp
        if second != int(created):
            second = int(created)
            text = time.strftime(self.default_time_format, self.converter(created))
            self._stamp = (second, text)  # one assignment: a thread reads a matching pair
        return self.default_msec_format % (text, msecs)

    def formatMessage(self, record: logging.LogRecord) -> str:
        return self._with_fields(super().formatMessage(record), getattr(record, "fields", None))

    @staticmethod
    def _with_fields(line: str, fields: dict[str, Any] | None) -> str:
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
        return escape_controls(line)

    def line(self, created: float, level: int, name: str, message: str, fields: dict[str, Any]) -> str | None:
        """What :meth:`format` writes for a record of these values without an exception (None: this
        formatter was given a format or date format of its own, which only a record goes through)."""
        if self._fmt != TEXT_FORMAT or self.datefmt is not None or not self.default_msec_format:
            return None
        when = self._time(created, _msecs(created))
        return self._with_fields(f"{when} {logging.getLevelName(level)} {name}: {message}", fields)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, the
    current request's ``request_id``, a record's ``fields``, and ``exception`` (its traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = self._entry(record.created, record.levelname, record.name, record.getMessage(),
                            getattr(record, "fields", None))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)

    @staticmethod
    def _entry(created: float, levelname: str, name: str, message: str, fields: dict[str, Any] | None) -> dict:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(created, datetime.timezone.utc).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": levelname.lower(),
            "logger": name,
            "message": message,
        }
        request_id = request_context.request_id()
        if request_id is not None:
            entry["request_id"] = request_id
        if fields:
            entry.update(fields)
        return entry

    def line(self, created: float, level: int, name: str, message: str, fields: dict[str, Any]) -> str:
        """What :meth:`format` writes for a record of these values without an exception."""
        return json.dumps(self._entry(created, logging.getLevelName(level), name, message, fields), default=str,
                          ensure_ascii=False)


def _msecs(created: float) -> float:
    """A record's ``msecs`` for its ``created`` time, as ``logging.LogRecord`` works it out."""
    return int((created - int(created)) * 1000) + 0.0


class OwnHandler(logging.StreamHandler):
    """The handler :func:`configure_logging` installs (a ``StreamHandler`` to standard error); marked so
    that :func:`sole_handler` can tell it from anyone else's.

    Access lines (:meth:`write_line`) written on an event loop's thread are held to the end of the loop's turn
    and written together: one ``write`` for the turn's lines where there was one per request (a batch of
    one-text requests is answered in one turn, ~10 lines; the writes were 6–7% of such a request's CPU). A
    record logged meanwhile, from any thread, writes them first (the order of lines is kept), and :meth:`flush`
    writes them too (logging's shutdown flushes every handler). Where the loop stopped before its turn ended (its
    write never ran), the next line is held for the turn of the loop that writes it instead."""

    def __init__(self, stream=None) -> None:
        super().__init__(stream)
        self._held: list[str] = []
        self._turn: asyncio.AbstractEventLoop | None = None  # the loop whose turn writes the lines held

    def write_line(self, line: str) -> None:
        """``line`` written as :meth:`emit` writes a formatted record: at the end of the running loop's turn,
        or now where no loop runs on this thread."""
        with self.lock:
            self._held.append(line)
            turn = self._turn
            if turn is not None and turn.is_running():
                return  # the first line held has scheduled the write on that loop
        try:
            loop = asyncio.get_running_loop()  # once per turn, not per line
        except RuntimeError:
            self._write_held()
            return
        self._turn = loop
        loop.call_soon(self._write_held)

    def flush(self) -> None:
        with self.lock:
            if self._held:
                text = self.terminator.join(self._held) + self.terminator
                self._held.clear()
                self.stream.write(text)
            self._turn = None
            super().flush()

    def emit(self, record: logging.LogRecord) -> None:
        if self._held:
            self._write_held()
        super().emit(record)

    def _write_held(self) -> None:
        try:
            self.flush()
        except RecursionError:
            raise
        except Exception:  # noqa: BLE001 - as logging's own emit: a log line never fails the request
            if logging.raiseExceptions:
                traceback.print_exc(file=sys.stderr)


def sole_handler(logger: logging.Logger, level: int) -> OwnHandler | None:
    """The handler of :func:`configure_logging` when a record of ``logger`` at ``level`` would reach it and
    nothing else: no other handler, filter or record factory anywhere on its way (then its line can be
    written without a ``LogRecord``: ``Formatter.line``, the hot path of the access log). None otherwise,
    e.g. while a test's log capture or an exporter's handler listens."""
    if logging.getLogRecordFactory() is not logging.LogRecord:
        return None
    node: logging.Logger | None = logger
    while node is not None:
        if node.filters or node.disabled:
            return None
        if node.handlers:
            if node.parent is not None or len(node.handlers) != 1:
                return None  # a handler below the root, or a second one on it
            handler = node.handlers[0]
            if (type(handler) is not OwnHandler or handler.filters or level < handler.level
                    or type(handler.formatter) not in (TextFormatter, JsonFormatter)):
                return None
            return handler
        if not node.propagate:
            return None
        node = node.parent
    return None
