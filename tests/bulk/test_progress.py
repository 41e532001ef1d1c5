"""The job's progress: a bar redrawn in place on a terminal, plain lines elsewhere."""

from __future__ import annotations

import io

from core.bulk.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar_with_rate_and_eta_redrawn_in_place():
    stream = Terminal()
    progress = Progress(total=1000, stream=stream)
    progress.start(0)
    progress._started -= 10  # ten seconds in
    progress.update(250, 240)
    progress.finish()
    text = stream.getvalue()
    assert text.startswith("\r[#######-----------------------] 250/1000 rows, 25 rows/s, 240 embedded, ETA 0m30s")
    assert text.endswith("\n") and text.count("\n") == 1  # one line, redrawn; ended once


def test_elsewhere_plain_lines_at_most_every_few_seconds():
    stream = io.StringIO()
    progress = Progress(total=None, stream=stream, every_s=3600)
    progress.start(100)
    progress.update(200, 100)
    progress.update(300, 200)  # within the interval: not printed
    progress.finish()
    lines = stream.getvalue().splitlines()
    assert lines[0] == "starting at row 100"
    assert len(lines) == 2 and lines[1].startswith("200 rows, ") and "ETA" not in lines[1]
    assert "\r" not in stream.getvalue()
