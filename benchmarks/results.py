"""A benchmark cell's figures, one JSON-ready row per cell, and the Markdown tables the scripts print."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field


@dataclass
class Cell:
    """One closed-loop cell: what was sent (texts, batch, concurrency) and what came back."""

    texts: str
    batch: int
    concurrency: int
    items: int = 0
    tokens: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cpu_seconds: float | None = None
    #: the load generator's own CPU in the window (never the server's)
    client_cpu_seconds: float | None = None

    def row(self) -> dict:
        lat = sorted(self.latencies)

        def pct(p):
            return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")

        return {
            "texts": self.texts, "batch": self.batch, "conc": self.concurrency,
            "emb/s": self.items / self.seconds if self.seconds else 0.0,
            "tok/s": self.tokens / self.seconds if self.seconds else 0.0,
            "p50 ms": pct(0.50), "p90 ms": pct(0.90), "p99 ms": pct(0.99),
            "errors": self.errors, "requests": len(lat),
            "server cpu %": (100 * self.cpu_seconds / self.seconds) if self.cpu_seconds is not None else None,
            # CPU the server spent per request (all its threads): compare with the in-process "cpu ms/batch"
            "server cpu ms/req": (1000 * self.cpu_seconds / len(lat)) if self.cpu_seconds is not None and lat else None,
        }

    @classmethod
    def combine(cls, parts: list["Cell"]) -> "Cell":
        """Parts of one cell run side by side (a load split over processes): counts, latencies and the load
        generator's CPU summed, the window their mean, the server CPU as the first part read it."""
        first = parts[0]
        total = cls(first.texts, first.batch, sum(p.concurrency for p in parts))
        for part in parts:
            total.items += part.items
            total.tokens += part.tokens
            total.errors += part.errors
            total.latencies.extend(part.latencies)
        total.seconds = sum(p.seconds for p in parts) / len(parts)
        total.cpu_seconds = first.cpu_seconds
        clients = [p.client_cpu_seconds for p in parts]
        total.client_cpu_seconds = None if None in clients else sum(clients)
        return total


def print_table(rows: list[dict], title: str) -> None:
    """``rows`` (dicts with the same keys) as a Markdown table under ``### title``; floats to one decimal."""
    if not rows:
        return
    cols = list(rows[0])
    print(f"\n### {title}\n")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        cells = []
        for c in cols:
            v = r[c]
            cells.append(f"{v:.1f}" if isinstance(v, float) else ("" if v is None else str(v)))
        print("| " + " | ".join(cells) + " |")


def table(rows: list[dict], title: str, level: int = 3) -> str:
    """``print_table``'s text as a string, its title at heading ``level``."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_table(rows, title)
    return buf.getvalue().replace("\n### ", "\n" + "#" * level + " ")
