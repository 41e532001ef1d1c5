#!/usr/bin/env python
"""CPU per access line written by the server's own log handler (``core.logs.OwnHandler.write_line``) to a file,
on uvloop, with 1 and with 10 lines written per turn of the event loop (a batch of one-text requests is answered
in one turn). With ``--baseline DIR`` the same is measured from another checkout, interleaved, each side in a
fresh process.

    git worktree add --detach /tmp/before HEAD~1
    python scripts/bench_access_log.py --baseline /tmp/before --rounds 3

Prints µs of CPU per line, the loop's turn included, per side, lines per turn and round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINE = ("2026-01-01 00:00:00,000 INFO tessera.access: POST /v1/embeddings 200 method=POST route=/v1/embeddings "
        "path=/v1/embeddings status=200 duration_ms=11.95 request_id=d3b4994ea972e1aada310569a941a2f0 model=bench "
        "inputs=1 tokens=12")


def child(lines: int, per_turn: int, path: str) -> float:
    """In the child (this checkout's ``core`` first on ``sys.path``): µs CPU per line."""
    import asyncio

    from core.logs import OwnHandler

    async def write() -> float:
        with open(path, "w") as stream:
            handler = OwnHandler(stream)
            for _ in range(200):  # warm
                handler.write_line(LINE)
            await asyncio.sleep(0)
            started = time.process_time()
            for _ in range(lines // per_turn):
                for _ in range(per_turn):
                    handler.write_line(LINE)
                await asyncio.sleep(0)
            handler.flush()
            return (time.process_time() - started) / (lines // per_turn * per_turn) * 1e6

    try:
        import uvloop
        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(write())


def measure(root: Path, lines: int, per_turn: int) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-access-log-") as folder:
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--lines", str(lines),
                              "--per-turn", str(per_turn), "--file", str(Path(folder) / "access.log")],
                             cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, check=True,
                             stdout=subprocess.PIPE, text=True, timeout=300)
    return json.loads(out.stdout)["us_per_line"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, help="another checkout of Tessera, measured interleaved")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--lines", type=int, default=20_000, help="lines per measurement")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--per-turn", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps({"us_per_line": child(args.lines, args.per_turn, args.file)}))
        return 0
    sides = {"this": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    for r in range(1, args.rounds + 1):
        for per_turn in (1, 10):
            figures = ", ".join(f"{name} {measure(root, args.lines, per_turn):.2f}" for name, root in sides.items())
            print(f"round {r}, {per_turn:2d} lines per turn: µs CPU per line: {figures}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
