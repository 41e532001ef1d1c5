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

Per backend: start a real server on loopback (scripts/bench.py's start_server/wait_ready), check parity of
its answers (encoding_format float) against the CPU fp32 reference (sentence-transformers on the original
fp32 weights, from --prepare; worst and mean cosine), load it closed-loop with texts × batch × concurrency
(bench.http_cell, every response verified; the clients are split over a few processes so the load
generator is not the limit), then the in-process figures (bench.inprocess_cells). A global deadline skips
the cells that no longer fit and still writes the results; the JSON and Markdown are rewritten after each
phase, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench  # noqa: E402

START_MARKER = "<!-- gpu-bench:start -->"
END_MARKER = "<!-- gpu-bench:end -->"
PREPARED_MODEL = ROOT / ".whl" / "minilm-fp16"
ORT_GPU_MISSING = ("not run: onnxruntime-gpu is not installed on this machine (pip install onnxruntime-gpu to "
                   "measure it); its onnxruntime has providers {providers}")
#: seconds kept back at the end for tearing down and writing the results
RESERVE_S = 15.0
#: the model folder's files the server needs (README, data_config.json etc. stay behind)
MODEL_FILES = ("config.json", "config_sentence_transformers.json", "modules.json", "sentence_bert_config.json",
               "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt")


# ---- docs/benchmarks.md section (pure, unit-tested) -------------------------------------------------

def replace_section(doc: str, section: str) -> str:
    """``doc`` with the text between the gpu-bench markers replaced by ``section`` (markers inside
    ``section`` itself, as in a whole file written by this script, are dropped first)."""
    if doc.count(START_MARKER) != 1 or doc.count(END_MARKER) != 1:
        raise ValueError(f"expected exactly one {START_MARKER} and one {END_MARKER}")
    head, rest = doc.split(START_MARKER)
    if END_MARKER not in rest:
        raise ValueError(f"{END_MARKER} comes before {START_MARKER}")
    _, tail = rest.split(END_MARKER)
    if START_MARKER in section or END_MARKER in section:
        if section.count(START_MARKER) != 1 or section.count(END_MARKER) != 1:
            raise ValueError("the section has unbalanced gpu-bench markers")
        section = section.split(START_MARKER, 1)[1].split(END_MARKER, 1)[0]
    return f"{head}{START_MARKER}\n{section.strip()}\n{END_MARKER}{tail}"


def merge(section_file: Path, doc_file: Path) -> None:
    doc_file.write_text(replace_section(doc_file.read_text(), section_file.read_text()))
    print(f"replaced the gpu-bench section of {doc_file} with {section_file}")


# ---- preparation (here, with network and the original weights) -------------------------------------

def parity_texts() -> list[str]:
    return (bench.make_texts("short", 32, seed=7) + bench.make_texts("long", 32, seed=7)
            + bench.make_texts("mixed", 64, seed=7))


def prepare(dst: Path, src: Path | None) -> None:
    """``dst``: the model folder with float16-stored weights (half the size; the fp16 runs cast to fp16
    at load anyway) and ``reference.npz``: sentence-transformers fp32 CPU vectors of the parity texts,
    computed from the original fp32 weights."""
    import numpy as np
    import sentence_transformers
    import torch
    from safetensors.torch import load_file, save_file

    from core.config import default_model_path

    src = src or default_model_path()
    if dst.exists():
        shutil.rmtree(dst)
    dst.mkdir(parents=True)
    for name in MODEL_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, dst / name)
    if (src / "1_Pooling").is_dir():
        shutil.copytree(src / "1_Pooling", dst / "1_Pooling")
    tensors = load_file(str(src / "model.safetensors"))
    save_file({k: v.half() if v.is_floating_point() else v for k, v in tensors.items()},
              str(dst / "model.safetensors"), metadata={"format": "pt"})
    texts = parity_texts()
    torch.set_num_threads(1)
    model = sentence_transformers.SentenceTransformer(str(src), device="cpu")
    vectors = model.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
    np.savez_compressed(dst / "reference.npz", texts=np.array(texts), vectors=vectors.astype(np.float32),
             source=np.array(f"sentence-transformers {sentence_transformers.__version__} fp32 CPU on the "
                             "original fp32 weights"))
    print(f"wrote {dst} ({sum(f.stat().st_size for f in dst.rglob('*') if f.is_file()) / 2**20:.1f} MiB)")


# ---- budget ----------------------------------------------------------------------------------------

class Budget:
    """A global deadline (seconds after start) and the elapsed time of each phase."""

    def __init__(self, deadline_s: float):
        self.t0 = time.perf_counter()
        self.deadline_s = deadline_s
        self.phases: list[dict] = []
        self.hit = False

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return max(1.0, self.deadline_s - RESERVE_S - self.elapsed())

    def allows(self, seconds: float) -> bool:
        ok = self.elapsed() + seconds + RESERVE_S <= self.deadline_s
        self.hit = self.hit or not ok
        return ok

    @contextlib.contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        print(f"[{self.elapsed():6.1f} s] {name} ...", flush=True)
        try:
            yield
        finally:
            took = time.perf_counter() - start
            self.phases.append({"phase": name, "seconds": round(took, 2)})
            print(f"[{self.elapsed():6.1f} s] {name}: {took:.1f} s", flush=True)


# ---- machine ---------------------------------------------------------------------------------------

def machine_info(device: str) -> dict:
    info: dict = {"python": platform.python_version(), "cpus": len(os.sched_getaffinity(0))}
    for module in ("torch", "transformers", "onnxruntime", "numpy", "fastapi", "pydantic", "uvicorn"):
        try:
            info[module] = __import__(module).__version__
        except ImportError:
            info[module] = None
    try:
        import torch

        info["torch_cuda"] = torch.version.cuda
        info["cuda_available"] = torch.cuda.is_available()
        if device.startswith("cuda") and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["cudnn"] = torch.backends.cudnn.version()
    except ImportError:
        pass
    try:
        import onnxruntime

        info["ort_providers"] = onnxruntime.get_available_providers()
    except ImportError:
        info["ort_providers"] = []
    smi = _nvidia_smi(["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    if smi:
        info["nvidia_smi"] = smi.strip()
    return info


def _nvidia_smi(args: list[str]) -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_memory_mb(pid: int) -> float | None:
    """The server's GPU memory as nvidia-smi reports it (None where it lists no processes)."""
    out = _nvidia_smi(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
            return float(parts[1])
    return None


# ---- load: bench.http_cell over a few client processes ------------------------------------------------

def _warm(_: int) -> None:
    import aiohttp  # noqa: F401  (a spawned client imports its libraries before its first timed cell)
    import numpy  # noqa: F401


def _client(url, model, texts, kind, batch, concurrency, duration, dim, pid, counts) -> "bench.Cell":
    return asyncio.run(bench.http_cell(url, model, texts, kind, batch, concurrency, duration, dim, {}, pid,
                                       token_counts=counts))


def load_cell(pool: ProcessPoolExecutor | None, clients: int, url: str, texts: list[str], kind: str,
              batch: int, concurrency: int, duration: float, dim: int, pid: int, counts: dict) -> dict:
    """One closed-loop cell; ``concurrency`` workers split over up to ``clients`` processes (their
    counts and latencies summed; the rate over the mean window; server CPU read by the first)."""
    procs = max(1, min(clients, concurrency))
    shares = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    if pool is None or procs == 1:
        parts = [_client(url, "bench", texts, kind, batch, concurrency, duration, dim, pid, counts)]
    else:
        futures = [pool.submit(_client, url, "bench", texts, kind, batch, share, duration, dim,
                               pid if i == 0 else None, counts) for i, share in enumerate(shares)]
        parts = [f.result() for f in futures]
    total = bench.Cell(kind, batch, concurrency)
    for part in parts:
        total.items += part.items
        total.tokens += part.tokens
        total.errors += part.errors
        total.latencies.extend(part.latencies)
    total.seconds = sum(p.seconds for p in parts) / len(parts)
    total.cpu_seconds = parts[0].cpu_seconds
    return {**total.row(), "client procs": procs}


# ---- one backend -----------------------------------------------------------------------------------

def spec_for(backend: str, model_path: Path, device: str, dtype: str) -> tuple[dict | None, str | None]:
    """The served spec, or None and why it cannot run here."""
    if backend == "torch":
        return {"path": str(model_path), "backend": "torch", "device": device, "dtype": dtype}, None
    if backend != "onnx":
        raise SystemExit(f"unknown backend {backend!r} (torch, onnx)")
    import onnxruntime

    providers = onnxruntime.get_available_providers()
    if device.startswith("cuda") and "CUDAExecutionProvider" not in providers:
        return None, ORT_GPU_MISSING.format(providers=providers)
    folder = bench.ensure_onnx(model_path)  # exported once (fp32 + int8) under .venv/models/
    if dtype in ("float16", "fp16") and not (folder / "onnx" / "model_fp16.onnx").exists():
        from core.convert.onnx_fp16 import convert_fp16

        config = json.loads((folder / "config.json").read_text())  # fused, then fp16
        convert_fp16(folder / "onnx" / "model.onnx", folder / "onnx" / "model_fp16.onnx", config=config)
    return {"path": str(folder), "backend": "onnx", "device": device, "dtype": dtype}, None


def wait_loaded(url: str, proc, timeout: float) -> float:
    """Seconds until /ready answers 200, failing at once when the model failed to load (the server then
    stays up answering 503, and bench.wait_ready would spend its whole timeout)."""
    import httpx

    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            r = httpx.get(url + "/ready", timeout=2)
        except httpx.HTTPError:
            r = None
        if r is not None and r.status_code == 200:
            return time.perf_counter() - start
        if r is not None and "failed to load" in r.text:
            raise RuntimeError(r.json()["error"]["message"])
        time.sleep(0.1)
    raise RuntimeError(f"server not ready in {timeout:.0f} s")


def parity(url: str, reference: dict) -> dict:
    """Worst and mean cosine of the server's float vectors vs the reference, over the parity texts."""
    import httpx
    import numpy as np

    texts, ref = reference["texts"], reference["vectors"]
    got = []
    for i in range(0, len(texts), 32):
        r = httpx.post(url + "/v1/embeddings", json={"input": texts[i:i + 32], "model": "bench",
                                                     "encoding_format": "float"}, timeout=120)
        r.raise_for_status()
        got += [d["embedding"] for d in sorted(r.json()["data"], key=lambda d: d["index"])]
    got = np.asarray(got, dtype=np.float64)
    got /= np.linalg.norm(got, axis=1, keepdims=True)
    ref = ref / np.linalg.norm(ref, axis=1, keepdims=True)
    cos = (got * ref).sum(axis=1)
    return {"worst cosine": float(cos.min()), "mean cosine": float(cos.mean()), "texts": len(texts),
            "worst text index": int(cos.argmin()), "reference": reference["source"]}


def load_reference(path: Path | None, model_path: Path, threads: int) -> dict:
    """``reference.npz`` from --prepare, else Tessera's torch backend fp32 on CPU on these weights."""
    import numpy as np

    if path is not None and path.exists():
        data = np.load(path)
        return {"texts": [str(t) for t in data["texts"]], "vectors": data["vectors"], "source": str(data["source"])}
    from core.config import ModelSpec, Settings
    from core.engine import Engine
    from core.tasks.embed import EmbedRequest

    texts = parity_texts()
    engine = Engine.load(ModelSpec(path=model_path, backend="torch", device="cpu", dtype="float32"),
                         Settings(threads=threads))
    vectors = engine.run_sync(EmbedRequest(texts=texts, normalize=True)).vectors
    return {"texts": texts, "vectors": vectors,
            "source": f"Tessera torch fp32 CPU on the weights in {model_path.name} (no reference.npz)"}


def run_backend(name: str, args, model_path: Path, reference: dict, budget: Budget, pool, result: dict,
                write) -> None:
    key = f"{name}:{args.dtype}@{args.device}"
    entry: dict = {"status": "started"}
    result["backends"][key] = entry
    if not budget.allows(40):  # a server start, parity and a cell at least
        entry["status"] = "not run: deadline"
        return
    with budget.phase(f"{key}: prepare"):
        spec, why_not = spec_for(name, model_path, args.device, args.dtype)
    if spec is None:
        entry["status"] = why_not
        print(f"{key}: {why_not}", flush=True)
        return
    entry["spec"] = spec
    url = f"http://127.0.0.1:{args.port}"
    proc = None
    try:
        with budget.phase(f"{key}: server start"):
            proc = bench.start_server([{**spec, "name": "bench"}], args.port, args.threads, {})
            entry["start_to_ready_s"] = round(wait_loaded(url, proc, timeout=min(120.0, budget.left())), 2)
            import httpx

            entry["card"] = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
            probe = httpx.post(url + "/v1/embeddings", json={"input": "probe", "model": "bench"}, timeout=60)
            dim = len(probe.json()["data"][0]["embedding"])
        providers = entry["card"].get("providers")
        if name == "onnx" and args.device.startswith("cuda") and (not providers or providers[0] != "CUDAExecutionProvider"):
            entry["status"] = f"not run: ONNX Runtime fell back to {providers} (CUDA provider failed to load)"
            return
        with budget.phase(f"{key}: parity"):
            entry["parity"] = parity(url, reference)
        print(json.dumps(entry["parity"]), flush=True)
        write()
        entry["http"], entry["skipped cells"] = [], []
        with budget.phase(f"{key}: http cells"):
            for kind in args.texts:
                texts = bench.make_texts(kind, 2048)
                counts = bench.token_counts_for(model_path, texts)
                for batch in args.batch:
                    for conc in args.concurrency:
                        if not budget.allows(args.duration + 2):
                            entry["skipped cells"].append(f"{kind}/{batch}/{conc}")
                            continue
                        row = load_cell(pool, args.clients, url, texts, kind, batch, conc, args.duration, dim,
                                        proc.pid, counts)
                        entry["http"].append(row)
                        print(json.dumps(row), flush=True)
                        write()
        entry["server_peak_rss_mb"] = bench.peak_rss_mb(proc.pid)
        entry["server_gpu_mb"] = gpu_memory_mb(proc.pid) if args.device.startswith("cuda") else None
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    inproc_duration = min(args.duration, 2.0)
    estimate = 15 + len(args.texts) * len(args.batch) * 2 * (inproc_duration + 0.5)
    if args.no_inprocess:
        entry["inprocess"] = "not run: --no-inprocess"
    elif not budget.allows(estimate):
        entry["inprocess"] = f"not run: deadline (needs ≈{estimate:.0f} s)"
    else:
        with budget.phase(f"{key}: in-process cells"):
            entry["inprocess"] = bench.inprocess_cells(spec, args.texts, args.batch, inproc_duration, args.threads)
    entry["status"] = "ok" if not entry["skipped cells"] else "partial: deadline"


# ---- report ----------------------------------------------------------------------------------------

def table(rows: list[dict], title: str) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        bench.print_table(rows, title)
    return buf.getvalue().replace("\n### ", "\n#### ")


def markdown(result: dict) -> str:
    m = result["machine"]
    a = result["args"]
    lines = [
        f"## GPU: {m.get('gpu') or 'no GPU (' + a['device'] + ')'} ({', '.join(result['backends']) or 'nothing run'})",
        "",
        f"Run {result['started']}: `scripts/bench_gpu.py {' '.join(a['argv'])}`, "
        f"{result['total_s']:.0f} s in all. Machine: {m['cpus']} CPUs, {m.get('nvidia_smi') or 'no nvidia-smi'}; "
        f"Python {m['python']}, torch {m.get('torch')} (CUDA {m.get('torch_cuda')}), transformers "
        f"{m.get('transformers')}, onnxruntime {m.get('onnxruntime')} (providers: {', '.join(m.get('ort_providers') or [])}).",
        f"Model: all-MiniLM-L6-v2 (`{Path(a['model']).name}`). Server: `TESSERA_THREADS={a['threads']}`, "
        f"default max_batch_tokens ({a['batch_tokens']} on {a['device']}); load: {a['duration']:g} s per cell, "
        f"closed loop, clients split over up to {a['clients']} aiohttp process(es), `encoding_format: base64`, every response "
        "verified (count, order, dimension, finite). How to rerun it: [gpu-bench.md](gpu-bench.md).",
        "",
    ]
    if result.get("deadline_hit"):
        lines += [f"**The {a['deadline']:.0f} s deadline was hit: some cells were skipped (listed below).**", ""]
    for key, e in result["backends"].items():
        lines.append(f"### {key}")
        lines.append("")
        if "spec" not in e or e["status"].startswith("not run") or e["status"].startswith("failed"):
            lines += [f"{e['status']}.", ""]
            continue
        p = e.get("parity")
        if p:
            flag = "" if p["worst cosine"] >= 0.999 else " ⚠ below 0.999"
            lines.append(f"Parity vs the CPU fp32 reference ({p['reference']}), {p['texts']} texts: worst cosine "
                         f"**{p['worst cosine']:.6f}**{flag}, mean {p['mean cosine']:.6f}.")
        lines.append(f"Start → ready {e.get('start_to_ready_s')} s; server peak RSS {_num(e.get('server_peak_rss_mb'))}; "
                     f"GPU memory {_num(e.get('server_gpu_mb'))} (nvidia-smi).")
        if e.get("skipped cells"):
            lines.append(f"Skipped (deadline): {', '.join(e['skipped cells'])}.")
        errors = sum(r["errors"] for r in e.get("http", []))
        if errors:
            lines.append(f"**{errors} responses failed verification.**")
        lines.append(table(e.get("http", []), "HTTP, closed loop"))
        if isinstance(e.get("inprocess"), list):
            lines.append(table(e["inprocess"], "In-process (same model, same inputs; no HTTP, no batcher)"))
        elif e.get("inprocess"):
            lines += ["", f"In-process: {e['inprocess']}."]
        lines.append("")
    lines.append("Phases: " + ", ".join(f"{p['phase']} {p['seconds']:.0f} s" for p in result["phases"]) + ".")
    return "\n".join(lines).rstrip() + "\n"


def _num(v) -> str:
    return "n/a" if v is None else f"{v:.0f} MB"


# ---- main ------------------------------------------------------------------------------------------

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
    p.add_argument("--backends", default="torch,onnx")
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
    import multiprocessing

    pool = ProcessPoolExecutor(args.clients, mp_context=multiprocessing.get_context("spawn")) if args.clients > 1 else None
    if pool is not None:
        list(pool.map(_warm, range(args.clients)))
    try:
        for name in args.backends.split(","):
            try:
                run_backend(name, args, args.model, reference, budget, pool, result, write)
            except (Exception, SystemExit) as exc:  # one backend's failure must not lose the others' figures
                result["backends"].setdefault(f"{name}:{args.dtype}@{args.device}", {})["status"] = (
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
