"""The text log format: its time is logging's own default, also where it is formatted once per second."""

from __future__ import annotations

import logging

from core.logs import TEXT_FORMAT, TextFormatter


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
