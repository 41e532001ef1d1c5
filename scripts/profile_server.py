#!/usr/bin/env python
"""Where a loaded Tessera server spends its time: py-spy samples every thread of a real server on loopback
while the benchmarks' closed-loop client loads it, then prints, per thread, the share of wall time in
the runtime (ONNX Runtime's ``Session.run``), in Python work, and waiting, and the hottest Python frames.

    python scripts/profile_server.py --dtype float32 --texts short --batch 32 --concurrency 64 --seconds 8
    # the serving layer alone, one text per request
    python scripts/profile_server.py --model near-free --batch 1
    # only the thread holding the interpreter lock: what serializes the Python work, by thread and frame
    python scripts/profile_server.py --model near-free --batch 32 --gil
    # C frames too: the event loop thread's hottest frames, the garbage collector and system calls included
    python scripts/profile_server.py --model near-free --batch 1 --native

Needs py-spy (``pip install py-spy``; in the ``bench`` extra) and permission to ptrace the server (root or
``kernel.yama.ptrace_scope=0``). The raw samples are kept with ``--raw FILE`` (flamegraph.pl reads them).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.artifacts import ensure_onnx
from benchmarks.load import http_cell
from benchmarks.server import start_server, stop_server, wait_ready
from benchmarks.texts import make_texts

#: leaf frames that mean "this thread is waiting" (executor queue, event loop's selector, locks)
WAITING = ("_worker (concurrent/futures/thread.py:81)", "Runner.run (asyncio/runners.py", "wait (threading.py",
           "select (selectors.py", "_bootstrap_inner (threading.py")
RUNTIME = ("Session.run (onnxruntime",)


def samples(raw: Path):
    """py-spy's raw samples (``--threads``): (thread name, leaf frame, count) per line."""
    for line in raw.read_text(errors="replace").splitlines():  # a frame name may hold bytes that are not UTF-8
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():  # a frame name py-spy read with a newline in it: the sample's line is split
            continue
        frames = stack.split(";")
        yield frames[0].split(":", 1)[-1].strip(), frames[-1], int(count)


def summarize(raw: Path, top: int = 12) -> dict:
    """Per-thread shares (runtime / Python / waiting) and the hottest Python leaf frames outside the runtime."""
    threads: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    hot: collections.Counter = collections.Counter()
    for name, leaf, n in samples(raw):
        if leaf.startswith(RUNTIME):
            kind = "runtime"
        elif leaf.startswith(WAITING):
            kind = "waiting"
        else:
            kind = "python"
            hot[leaf] += n
        threads[name][kind] += n
    per_thread = {}
    for name, c in threads.items():
        total = sum(c.values())
        per_thread[name] = {k: round(100 * c[k] / total, 1) for k in ("runtime", "python", "waiting")}
        per_thread[name]["samples"] = total
    busy = sum(hot.values()) or 1
    return {"threads": per_thread,
            "hot_python_frames": [(f, round(100 * n / busy, 1)) for f, n in hot.most_common(top)]}


def hottest_frames(raw: Path, thread: str = "MainThread", top: int = 25) -> tuple[int, list[tuple[str, float]]]:
    """The leaf frames of ``thread``'s samples (C frames included where py-spy read them), by share of them."""
    leaves: collections.Counter = collections.Counter()
    for name, leaf, n in samples(raw):
        if name == thread:
            leaves[leaf] += n
    total = sum(leaves.values())
    return total, [(f, round(100 * n / (total or 1), 1)) for f, n in leaves.most_common(top)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("default", "near-free"), default="default",
                   help="the default model (ONNX export of all-MiniLM-L6-v2), or the near-free model of "
                        "scripts/bench_host_cpu.py (1 layer, hidden 32: what is left is the serving layer)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--texts", default="short")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--seconds", type=float, default=8.0, help="sampling time (the load runs 4 s longer)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=JSON", help="model-spec option")
    p.add_argument("--port", type=int, default=8790)
    p.add_argument("--raw", type=Path, help="keep py-spy's raw samples here")
    p.add_argument("--gil", action="store_true",
                   help="sample only the thread holding the interpreter lock: the Python work that runs one "
                        "thread at a time, whichever thread does it (the samples column is then its split)")
    p.add_argument("--native", action="store_true",
                   help="sample C frames too (py-spy --native, which stops the server for each sample): prints "
                        "the event loop thread's hottest frames, the garbage collector and system calls included")
    args = p.parse_args()
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(pyspy).exists():
        raise SystemExit("py-spy not found: pip install py-spy (in the bench and dev extras)")

    if args.model == "near-free":
        from benchmarks.host_cpu import model_folder

        folder = model_folder("near-free")
    else:
        from core.config import default_model_path

        folder = ensure_onnx(default_model_path())
    spec = {"path": str(folder), "name": "bench", "backend": "onnx", "dtype": args.dtype,
            **{k: json.loads(v) for k, v in (o.split("=", 1) for o in args.option)}}
    proc = start_server([spec], args.port, None, {})
    raw = args.raw or Path(tempfile.mkdtemp()) / "samples.txt"
    try:
        url = f"http://127.0.0.1:{args.port}"
        wait_ready(url, proc)
        result: dict = {}

        def load():
            cell = asyncio.run(http_cell(url, "bench", make_texts(args.texts, 2048), args.texts, args.batch,
                                         args.concurrency, args.seconds + 4, None, {}, proc.pid))
            result.update(cell.row())

        loader = threading.Thread(target=load)
        loader.start()
        time.sleep(2)
        # C frames are read with the process stopped (py-spy refuses --native with --nonblocking)
        subprocess.run([pyspy, "record", "-p", str(proc.pid), "-d", str(int(args.seconds)), "-r", "100",
                        "-f", "raw", "-o", str(raw), "--threads",
                        *(["--native"] if args.native else ["--nonblocking"]), *(["--gil"] if args.gil else [])],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        loader.join()
    finally:
        stop_server(proc)
    summary = summarize(raw)
    print(f"load: {args.texts} × {args.batch} per request, {args.concurrency} clients, {args.dtype} {spec}: "
          f"{result.get('emb/s', 0):.0f} emb/s, server CPU {result.get('server cpu %') or 0:.0f}%, "
          f"errors {result.get('errors')}")
    total = sum(s["samples"] for s in summary["threads"].values()) or 1
    print("\n| thread | in runtime % | Python % | waiting (or in the loop's C code) % | samples | share of all samples % |"
          "\n|---|---|---|---|---|---|")
    for name, s in sorted(summary["threads"].items(), key=lambda kv: -kv[1]["samples"]):
        print(f"| {name} | {s['runtime']} | {s['python']} | {s['waiting']} | {s['samples']} "
              f"| {100 * s['samples'] / total:.1f} |")
    if args.native:  # C leaf frames would count as Python work above: the loop thread's own list instead
        counted, frames = hottest_frames(raw)
        print(f"\nthe event loop thread's hottest frames, C included (share of its {counted} samples):")
        for frame, share in frames:
            print(f"  {share:5.1f}%  {frame[:160]}")
        return 0
    print("\nhottest Python frames (share of Python samples):")
    for frame, share in summary["hot_python_frames"]:
        print(f"  {share:5.1f}%  {frame}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
