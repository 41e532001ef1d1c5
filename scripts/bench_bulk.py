#!/usr/bin/env python
"""``python -m core embed`` measured: its embeddings/s against the plain in-process ONNX Runtime loop
(``benchmarks/plain_ort.py``: the same graph and threads, batches of 32), its peak RSS over corpus sizes,
the model work of a corpus with repeated texts, and a resume after SIGKILL at half way.

    python scripts/bench_bulk.py [--rows 100000] [--slices 4] [--rss default:10000,100000] \
        [--rss light:10000,100000,1000000] [--threads 2] [--skip rate,rss,repeats,resume]

Each job runs as its own process (``python -m core embed``, JSON Lines in, Parquet out) on the embedded
all-MiniLM-L6-v2 exported once to ONNX (.venv/models/), with short texts (benchmarks/texts.py, ≈ 13 tokens).
Printed, one JSON line per measurement:

- ``rate``: ``--rows`` distinct texts in ``--slices`` equal slices; each slice through the job (its
  summary's embeddings/s: process start-up excluded, model load and the final merge included; and its
  steady state, from its first whole part to its last, the work folder watched) and through
  the plain loop (one pass over the same texts), the order alternating per pair (job first, then plain
  first, ...), so a busy machine's drift hits both sides alike; the ratio per pair, then over all rows.
- ``rss``: the job's peak RSS (the job process's own ``VmHWM`` at its exit; and once every row is in a part,
  before the merge) per ``MODEL:ROWS,...``: ``default`` or ``light``
  (the same folder with a random 1-layer encoder, benchmarks/bulk_models.py: a near-free model, so a
  million rows take minutes and the job's own memory shows).
- ``repeats``: a corpus with 10% of its rows repeating earlier texts: the texts the model embedded / rows.
- ``resume``: the full job's seconds; the same job (parts of 1/20 of the rows) SIGKILLed once half its rows
  are in parts, then run again: the second run's seconds and its share of the full job's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import ROOT
from benchmarks.artifacts import ensure_onnx
from benchmarks.bulk_models import ensure_light_minilm
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


def parts_done(parts: Path) -> int:
    """Rows in the whole parts of a job's work folder (from the part files' names)."""
    return sum(int(p.stem.split("-")[2]) - int(p.stem.split("-")[1]) for p in parts.glob("part-*.parquet"))


def vm_hwm_mb(pid: int) -> float | None:
    """A running process's peak RSS so far (``VmHWM``), MB."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


# The job run through this: at its exit it writes its own peak RSS (VmHWM, KiB) into the file named first. Its
# ru_maxrss would not do: a child's starts at its parent's peak (the kernel keeps the larger across exec), and
# this process's grows with the corpora it writes.
PEAK_WRAPPER = """
import atexit, runpy, sys
peak_file = sys.argv.pop(1)

def record():
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(peak_file, "w") as out:
        out.write(peak)

atexit.register(record)
module = sys.argv[2]  # sys.argv: ["-c", "-m", MODULE, ARGS...]
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def run_job(command: list[str], kill_at: float | None = None, parts: Path | None = None, rows: int = 0,
            marks: list | None = None, phases: dict | None = None):
    """(seconds, summary stdout, peak RSS MB, killed) of one job process, with its work folder ``parts``
    watched: ``kill_at``: SIGKILL it once parts cover that share of ``rows``; ``marks``: filled with
    (seconds, rows in parts) each time a part appears; ``phases``: given ``embedded`` = the peak RSS (MB)
    when every row is in a part (``complete.json`` appears), before the merge into the output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    peak_file = Path(tempfile.mkstemp(prefix="tessera-bench-peak-")[1])
    if command[1] == "-m":
        command = [command[0], "-c", PEAK_WRAPPER, str(peak_file), *command[1:]]
    started = time.perf_counter()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    killed, ended = False, None
    if parts is not None:
        last = 0
        while ended is None:
            done = parts_done(parts)
            if marks is not None and done > last:
                marks.append((time.perf_counter() - started, done))
                last = done
            if phases is not None and "embedded" not in phases and (parts / "complete.json").exists():
                phases["embedded"] = vm_hwm_mb(proc.pid)
            if kill_at is not None and done >= kill_at * rows:
                proc.send_signal(signal.SIGKILL)
                killed = True
                break
            time.sleep(0.05)
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)  # reaped here: its rusage is read once
            ended = (pid, status, usage) if pid else None
    _, status, usage = ended or os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    output = proc.stdout.read()
    if not killed and proc.returncode != 0:
        raise SystemExit(f"job failed ({proc.returncode}): {output}")
    recorded = peak_file.read_text().strip()
    peak_file.unlink()
    return seconds, output, int(recorded) / 1024 if recorded else None, killed


def summary_value(output: str, pattern: str) -> float:
    match = re.search(pattern, output)
    if match is None:
        raise SystemExit(f"no {pattern!r} in the summary: {output}")
    return float(match.group(1))


def show(row: dict) -> None:
    print(json.dumps(row), flush=True)


def plain_pass(embed, texts: list[str], batch: int = 32) -> float:
    """The plain loop over every text of ``texts`` once, in batches of ``batch`` (one warm-up batch first,
    not timed). Returns embeddings/s."""
    embed(texts[:batch])
    started = time.perf_counter()
    for i in range(0, len(texts), batch):
        embed(texts[i:i + batch])
    return len(texts) / (time.perf_counter() - started)


def measure_rate(args, model: Path, work: Path) -> None:
    """``--rows`` distinct texts in ``--slices`` equal slices; each slice once through the job (its own
    process) and once through the plain loop, alternating which goes first (A/B, B/A, ...), so both sides see
    the same load drift. One line per pair, then the totals (rows / seconds of each side)."""
    from benchmarks.plain_ort import plain_ort_embedder

    embed = plain_ort_embedder(model / "onnx" / "model.onnx", model / "tokenizer.json", args.threads)
    size = args.rows // args.slices
    job_s = plain_s = 0.0
    for pair in range(args.slices):
        corpus = work / f"rate-{pair}.jsonl"
        write_corpus(corpus, size, seed=100 + pair)
        texts = [json.loads(line)["text"] for line in open(corpus)]
        order = ("job", "plain") if pair % 2 == 0 else ("plain", "job")
        rates = {}
        for side in order:
            if side == "job":
                out, marks = work / f"rate-{pair}.parquet", []
                seconds, output, rss, _ = run_job(job(corpus, out, model, args.threads), parts=Path(f"{out}.parts"),
                                                  marks=marks)
                rates["job"] = summary_value(output, r"embeddings/s: ([\d.]+)")
                # steady state: from the first whole part to the last (no model load, no merge)
                rates["steady"] = ((marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0])
                                   if len(marks) > 1 else None)
                job_s += size / rates["job"]
            else:
                rates["plain"] = plain_pass(embed, texts)
                plain_s += size / rates["plain"]
        show({"measure": "rate", "pair": pair + 1, "order": "/".join(order), "rows": size,
              "job_embeddings_per_s": rates["job"], "plain_loop_embeddings_per_s": round(rates["plain"], 1),
              "job/plain": round(rates["job"] / rates["plain"], 3),
              "job_steady_embeddings_per_s": rates["steady"] and round(rates["steady"], 1),
              "steady/plain": rates["steady"] and round(rates["steady"] / rates["plain"], 3),
              "job_peak_rss_mb": round(rss),
              "loadavg_1m": round(os.getloadavg()[0], 2)})
        corpus.unlink()
        (work / f"rate-{pair}.parquet").unlink()
    total = size * args.slices
    show({"measure": "rate", "pair": "all", "rows": total, "job_embeddings_per_s": round(total / job_s, 1),
          "plain_loop_embeddings_per_s": round(total / plain_s, 1), "job/plain": round(plain_s / job_s, 3)})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000, help="rate: distinct texts in all (default 100000)")
    p.add_argument("--slices", type=int, default=4, help="rate: job/plain pairs, each over rows/slices texts")
    p.add_argument("--rss", action="append", default=None, metavar="MODEL:ROWS[,ROWS...]",
                   help="rss: corpus sizes per model, MODEL default (all-MiniLM-L6-v2) or light (its 1-layer "
                        "stand-in, benchmarks/bulk_models.py); repeatable (default default:10000,1000000)")
    p.add_argument("--repeat-rows", type=int, default=20_000, help="repeats: corpus rows (default 20000)")
    p.add_argument("--resume-rows", type=int, default=None, help="rows of the resume measurement (default --rows)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip", default="", help="comma-separated: rate, rss, repeats, resume")
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    from core.config import default_model_path

    model = ensure_onnx(default_model_path())
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-bulk-"))
    if "rate" not in skip:
        measure_rate(args, model, work)
    if "rss" not in skip:
        for spec in args.rss or ["default:10000,1000000"]:
            name, _, sizes = spec.partition(":")
            if name not in ("default", "light"):
                raise SystemExit(f"--rss {spec}: MODEL is default or light")
            folder = model if name == "default" else ensure_light_minilm(default_model_path())
            for rows in [int(r) for r in sizes.split(",") if r]:
                corpus = work / f"rss-{rows}.jsonl"
                write_corpus(corpus, rows, seed=rows)
                out = work / f"rss-{name}-{rows}.parquet"
                phases = {}
                seconds, output, rss, _ = run_job(job(corpus, out, folder, args.threads),
                                                  parts=Path(f"{out}.parts"), phases=phases)
                embedded = phases.get("embedded")
                show({"measure": "rss", "model": name, "rows": rows, "peak_rss_mb": round(rss),
                      "peak_rss_before_merge_mb": embedded and round(embedded),
                      "seconds": round(seconds, 1), "embeddings_per_s": summary_value(output, r"embeddings/s: ([\d.]+)"),
                      "output_mb": round(out.stat().st_size / 2**20), "loadavg_1m": round(os.getloadavg()[0], 2)})
                corpus.unlink()
                out.unlink()
    if "repeats" not in skip:
        rows = args.repeat_rows
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
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
