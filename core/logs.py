"""Logging set-up for the process entry points. Request text and media are never logged."""

import logging

#: level names other runtimes use (AWS Lambda's ``AWS_LAMBDA_LOG_LEVEL``: TRACE, WARN, FATAL) → Python's
_ALIASES = {"TRACE": "DEBUG", "WARN": "WARNING", "FATAL": "CRITICAL"}


def level_number(level: str) -> int:
    """``info``, ``WARN``, ``TRACE``... as a ``logging`` level (INFO for a name that is not one)."""
    name = _ALIASES.get(level.strip().upper(), level.strip().upper())
    number = logging.getLevelName(name)
    return number if isinstance(number, int) else logging.INFO


def configure_logging(level: str = "info") -> None:
    """Log at ``level``. Where the host process already put a handler on the root logger before our
    code ran (AWS Lambda's runtime interface client does, with its own text or JSON format), that
    handler and its format are kept and only the level is set: ``basicConfig`` would do nothing there,
    and a second handler would print every line twice in two formats."""
    root = logging.getLogger()
    if root.handlers:
        root.setLevel(level_number(level))
        return
    logging.basicConfig(level=level_number(level), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
