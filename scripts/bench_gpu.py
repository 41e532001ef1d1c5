#!/usr/bin/env python
"""GPU benchmark of a Tessera server: torch fp16 (and ONNX Runtime's CUDA provider when present) on CUDA.

One command that finishes in under 8 minutes, also on a GPU machine without network: see
docs/gpu-bench.md. On such a machine the entry point is scripts/bench_gpu.sh (installs the wheels of
.whl/, prints nvidia-smi, then runs this file); scripts/fetch_gpu_wheels.sh prepares .whl/ beforehand on a
machine with PyPI access.

    # on the GPU machine (directly, or through scripts/bench_gpu.sh)
    python scripts/bench_gpu.py --out $OUT

    # CPU smoke run of the same pipeline (any machine): torch fp32 on CPU, one tiny cell
    python scripts/bench_gpu.py --device cpu --dtype float32 --duration 1 --texts short --batch 1 \
        --concurrency 1 --out .bench/gpu-smoke

    # after a GPU run, in the checkout: put its Markdown section into docs/benchmarks.md (between the gpu-bench markers)
    python scripts/bench_gpu.py --merge path/to/benchmarks-gpu.md

    # by scripts/fetch_gpu_wheels.sh: the fp16-stored model folder + CPU fp32 reference vectors
    python scripts/bench_gpu.py --prepare .whl/minilm-fp16

Per backend (benchmarks.gpu): start a real server on loopback (benchmarks.server), check parity of its
answers (encoding_format float) against the CPU fp32 reference (sentence-transformers on the original
fp32 weights, from --prepare; worst and mean cosine: benchmarks.parity), load it closed-loop with texts ×
batch × concurrency (benchmarks.load, every response verified; the clients are split over a few processes
so the load generator is not the limit), then the in-process figures (benchmarks.inprocess). A global
deadline (benchmarks.budget) skips the cells that no longer fit and still writes the results; the JSON and
Markdown (benchmarks.gpu_report) are rewritten after each phase, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks.budget import Budget
from benchmarks.docs_section import merge
from benchmarks.gpu import entry_key, run_backend
from benchmarks.gpu_report import markdown
from benchmarks.load import warm_client
from benchmarks.machine import machine_info
from benchmarks.parity import load_reference, prepare

ROOT = Path(__file__).resolve().parents[1]
PREPARED_MODEL = ROOT / ".whl" / "minilm-fp16"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--merge", type=Path, metavar="FILE.md", help="put FILE.md's section into --doc and exit")
    p.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md")
    p.add_argument("--prepare", type=Path, metavar="DIR", help="write the fp16-stored model + reference and exit")
    p.add_argument("--source-model", type=Path, help="--prepare: model folder (default: the embedded MiniLM)")
    p.add_argument("--model", type=Path, help="default: .whl/minilm-fp16 when prepared, else the embedded MiniLM")
    p.add_argument("--reference", type=Path, help="default: <model>/reference.npz (else computed here, fp32 CPU)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float16")
    p.add_argument("--backends", default="auto,torch,onnx",
                   help="auto: the folder alone, served with the defaults (device, backend and dtype chosen by "
                        "the server); torch / onnx: with --device and --dtype")
    p.add_argument("--texts", default="short,long,mixed")
    p.add_argument("--batch", default="1,32")
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--duration", type=float, default=4.0, help="seconds per HTTP cell")
    p.add_argument("--deadline", type=float, default=400.0, help="seconds after start: later cells are skipped")
    cpus = len(os.sched_getaffinity(0))
    p.add_argument("--threads", type=int, default=max(1, cpus // 2), help="server TESSERA_THREADS (default: half the CPUs)")
    p.add_argument("--clients", type=int, default=max(1, min(4, cpus // 4)), help="load-generator processes")
    p.add_argument("--port", type=int, default=8777)
    p.add_argument("--no-inprocess", action="store_true")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or ROOT / ".bench" / "gpu"))
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)

    if args.merge:
        merge(args.merge, args.doc)
        return 0
    if args.prepare:
        prepare(args.prepare, args.source_model)
        return 0

    budget = Budget(args.deadline)
    from core.config import ModelSpec

    args.texts = args.texts.split(",")
    args.batch = [int(x) for x in args.batch.split(",")]
    args.concurrency = [int(x) for x in args.concurrency.split(",")]
    if args.model is None:
        if PREPARED_MODEL.exists():
            args.model = PREPARED_MODEL
        else:
            from core.config import default_model_path

            args.model = default_model_path()
    if args.reference is None:
        args.reference = args.model / "reference.npz"
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    result: dict = {
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "args": {"argv": argv, "model": str(args.model), "device": args.device, "dtype": args.dtype,
                 "threads": args.threads, "clients": args.clients, "duration": args.duration,
                 "deadline": args.deadline, "batch_tokens": ModelSpec(path=args.model, device=args.device).batch_tokens},
        "backends": {}, "phases": budget.phases,
    }

    def write() -> None:
        result["total_s"] = round(budget.elapsed(), 1)
        result["deadline_hit"] = budget.hit
        (args.out / "gpu-bench.json").write_text(json.dumps(result, indent=2, default=str))
        (args.out / "benchmarks-gpu.md").write_text(markdown(result))

    with budget.phase("machine info"):
        result["machine"] = machine_info(args.device)
    print(json.dumps(result["machine"], indent=1), flush=True)
    with budget.phase("reference"):
        reference = load_reference(args.reference, args.model, args.threads)
    write()
    pool = ProcessPoolExecutor(args.clients, mp_context=multiprocessing.get_context("spawn")) if args.clients > 1 else None
    if pool is not None:
        list(pool.map(warm_client, range(args.clients)))
    try:
        for name in args.backends.split(","):
            try:
                run_backend(name, args, args.model, reference, budget, pool, result, write)
            except (Exception, SystemExit) as exc:  # one backend's failure must not lose the others' figures
                result["backends"].setdefault(entry_key(name, args), {})["status"] = (
                    f"failed: {type(exc).__name__}: {exc}")
                print(f"{name}: failed: {exc!r}", flush=True)
            write()
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        write()
    print(f"\nwrote {args.out / 'gpu-bench.json'} and {args.out / 'benchmarks-gpu.md'} "
          f"({budget.elapsed():.0f} s)", flush=True)
    print(markdown(result))
    failed = [k for k, e in result["backends"].items() if str(e.get("status", "")).startswith("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
