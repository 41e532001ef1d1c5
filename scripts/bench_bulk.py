#!/usr/bin/env python
"""``python -m core embed`` measured: its embeddings/s against the plain in-process ONNX Runtime loop
(``benchmarks/plain_ort.py``, the same graph and threads), its peak RSS at two corpus sizes, the model work
of a corpus with repeated texts, and a resume after SIGKILL at half way.

    python scripts/bench_bulk.py [--rows 100000] [--small 10000] [--large 1000000] [--threads 2] \
        [--skip rss,resume,...]

Each job runs as its own process (``python -m core embed``, JSON Lines in, Parquet out) on the embedded
all-MiniLM-L6-v2 exported once to ONNX (.venv/models/), with short texts (benchmarks/texts.py, ≈ 13 tokens).
Printed, one JSON line per measurement:

- ``rate``: the job's rows/s over ``--rows`` distinct texts, from its summary (model load and the final
  merge included) and measured from its first to its last part (steady state); the plain loop's
  embeddings/s over the same texts in batches of 32 for as many seconds; the ratios.
- ``rss``: the job's peak RSS (the child's ``ru_maxrss``) at ``--small`` and ``--large`` rows.
- ``repeats``: a corpus with 10% of its rows repeating earlier texts: the texts the model embedded / rows.
- ``resume``: the full job's seconds; the same job (parts of 1/20 of the rows) SIGKILLed once half its rows
  are in parts, then run again: the second run's seconds and its share of the full job's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import ROOT
from benchmarks.artifacts import ensure_onnx
from benchmarks.plain_ort import plain_ort_loop
from benchmarks.texts import make_texts


def write_corpus(path: Path, rows: int, repeat_share: float = 0.0, seed: int = 0) -> list[str]:
    distinct = rows - int(rows * repeat_share)
    texts = make_texts("short", distinct, seed=seed)
    with open(path, "w") as handle:
        for i in range(rows):
            # unique texts with a row suffix; a repeat takes an earlier row's text again
            text = texts[i] + f" {i}" if i < distinct else texts[(i * 7) % distinct] + f" {(i * 7) % distinct}"
            handle.write(json.dumps({"text": text}) + "\n")
    return texts


def job(corpus: Path, out: Path, model: Path, threads: int, extra: list[str] = ()) -> list[str]:
    return [sys.executable, "-m", "core", "embed", "--input", str(corpus), "--output", str(out), "--model",
            f"path={model},name=minilm,backend=onnx", "--threads", str(threads), *extra]


def run_job(command: list[str], kill_at: float | None = None, parts: Path | None = None, rows: int = 0):
    """(seconds, summary stdout, peak RSS MB, killed) of one job process; ``kill_at``: SIGKILL it once parts
    cover that share of ``rows``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    killed = False
    if kill_at is not None:
        while proc.poll() is None:
            done = sum(int(p.stem.split("-")[2]) - int(p.stem.split("-")[1]) for p in parts.glob("part-*.parquet"))
            if done >= kill_at * rows:
                proc.send_signal(signal.SIGKILL)
                killed = True
                break
            time.sleep(0.05)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    output = proc.stdout.read()
    if not killed and proc.returncode != 0:
        raise SystemExit(f"job failed ({proc.returncode}): {output}")
    return seconds, output, usage.ru_maxrss / 1024, killed


def summary_value(output: str, pattern: str) -> float:
    match = re.search(pattern, output)
    if match is None:
        raise SystemExit(f"no {pattern!r} in the summary: {output}")
    return float(match.group(1))


def show(row: dict) -> None:
    print(json.dumps(row), flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--small", type=int, default=10_000)
    p.add_argument("--large", type=int, default=1_000_000)
    p.add_argument("--resume-rows", type=int, default=None, help="rows of the resume measurement (default --rows)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip", default="", help="comma-separated: rate, rss, repeats, resume")
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    from core.config import default_model_path

    model = ensure_onnx(default_model_path())
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-bulk-"))
    if "rate" not in skip:
        corpus = work / "rate.jsonl"
        write_corpus(corpus, args.rows)
        out = work / "rate.parquet"
        seconds, output, rss, _ = run_job(job(corpus, out, model, args.threads, ["--rows-per-part", "8192"]))
        job_rate = summary_value(output, r"embeddings/s: ([\d.]+)")
        texts = [json.loads(line)["text"] for line in open(corpus)]
        plain = plain_ort_loop(model / "onnx" / "model.onnx", model / "tokenizer.json", texts, 32,
                               min(seconds, 120), args.threads)
        show({"measure": "rate", "rows": args.rows, "job_seconds": round(seconds, 1),
              "job_embeddings_per_s": job_rate, "plain_loop_embeddings_per_s": round(plain, 1),
              "job/plain": round(job_rate / plain, 3), "peak_rss_mb": round(rss)})
    if "rss" not in skip:
        for rows in (args.small, args.large):
            corpus = work / f"rss-{rows}.jsonl"
            write_corpus(corpus, rows, seed=rows)
            seconds, output, rss, _ = run_job(job(corpus, work / f"rss-{rows}.parquet", model, args.threads))
            show({"measure": "rss", "rows": rows, "peak_rss_mb": round(rss), "seconds": round(seconds, 1),
                  "embeddings_per_s": summary_value(output, r"embeddings/s: ([\d.]+)")})
            corpus.unlink()
    if "repeats" not in skip:
        rows = min(args.rows, 20_000)
        corpus = work / "repeats.jsonl"
        write_corpus(corpus, rows, repeat_share=0.10, seed=7)
        _, output, _, _ = run_job(job(corpus, work / "repeats.parquet", model, args.threads))
        computed = summary_value(output, r"unique texts embedded: (\d+)")
        show({"measure": "repeats", "rows": rows, "repeated_share": 0.10, "embedded": int(computed),
              "model_work_share": round(computed / rows, 4)})
    if "resume" not in skip:
        rows = args.resume_rows or args.rows
        corpus = work / "resume.jsonl"
        write_corpus(corpus, rows, seed=11)
        part = ["--rows-per-part", str(max(1, rows // 20))]  # a part boundary at half way
        full, _, _, _ = run_job(job(corpus, work / "full.parquet", model, args.threads, part))
        out = work / "resumed.parquet"
        command = job(corpus, out, model, args.threads, part)
        first, _, _, killed = run_job(command, kill_at=0.5, parts=Path(str(out) + ".parts"), rows=rows)
        second, output, _, _ = run_job(command)
        show({"measure": "resume", "rows": rows, "full_seconds": round(full, 1), "killed": killed,
              "killed_after_seconds": round(first, 1), "resume_seconds": round(second, 1),
              "resume/full": round(second / full, 3),
              "done_before": int(summary_value(output, r"this run, (\d+) done before"))})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
