"""Progress of a job: a bar redrawn in place on a terminal (rows, rows/s, ETA where the row count is
known), plain lines every ``every_s`` seconds otherwise (the command prints the summary at the end)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int | None = None, stream: TextIO | None = None, every_s: float = 10.0) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s if not self.tty else 0.2
        self._start_rows = 0
        self._started = time.monotonic()
        self._last: float | None = None  # when a line was last written

    def start(self, rows_done: int) -> None:
        self._start_rows = rows_done
        self._started = time.monotonic()
        if not self.tty:
            total = f" of {self.total}" if self.total is not None else ""
            self._print(f"starting at row {rows_done}{total}")

    def _rate(self, rows: int) -> float:
        elapsed = time.monotonic() - self._started
        return (rows - self._start_rows) / elapsed if elapsed > 0 else 0.0

    def line(self, rows: int, computed: int) -> str:
        rate = self._rate(rows)
        parts = [f"{rows}" + (f"/{self.total}" if self.total else "") + " rows", f"{rate:.0f} rows/s",
                 f"{computed} embedded"]
        if self.total and rate > 0:
            parts.append(f"ETA {_duration((self.total - rows) / rate)}")
        return ", ".join(parts)

    def update(self, rows: int, computed: int) -> None:
        now = time.monotonic()
        if self._last is not None and now - self._last < self.every_s:
            return
        self._last = now
        if self.tty:
            bar = ""
            if self.total:
                done = int(30 * min(1.0, rows / self.total))
                bar = "[" + "#" * done + "-" * (30 - done) + "] "
            self.stream.write("\r" + bar + self.line(rows, computed) + "\033[K")
            self.stream.flush()
        else:
            self._print(self.line(rows, computed))

    def finish(self) -> None:
        if self.tty and self._last is not None:
            self.stream.write("\n")
            self.stream.flush()

    def _print(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"
