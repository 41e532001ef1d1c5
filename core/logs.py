"""Logging set-up for the process entry points. Request text and media are never logged.

``fmt="text"`` (the default) writes ``time level logger: message``; ``fmt="json"`` writes every line as
one JSON object (:class:`JsonFormatter`), uvicorn's own loggers included. Lines logged while a request
is in progress carry its ``request_id``; the access line (logger ``tessera.access``, one per request)
carries its fields in the record's ``fields`` (see ``core.api.observability``)."""

from __future__ import annotations

import datetime
import json
import logging
import re
import time
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
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=_level(level), handlers=[handler], force=True)
    else:
        handler = logging.StreamHandler()
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
        second, text = self._stamp
        if second != int(record.created):
            second = int(record.created)
            text = time.strftime(self.default_time_format, self.converter(record.created))
            self._stamp = (second, text)  # one assignment: a thread reads a matching pair
        return self.default_msec_format % (text, record.msecs)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        fields = getattr(record, "fields", None)
        if fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
        return escape_controls(line)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``, the
    current request's ``request_id``, a record's ``fields``, and ``exception`` (its traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = request_context.request_id()
        if request_id is not None:
            entry["request_id"] = request_id
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)
