"""One backend of the GPU benchmark: the served spec, a real server on loopback, parity against the CPU fp32
reference, the closed-loop cells within the time budget, then the in-process figures."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.artifacts import ensure_onnx, ensure_onnx_fp16, token_counts_for
from benchmarks.budget import Budget
from benchmarks.inprocess import inprocess_cells
from benchmarks.load import load_cell
from benchmarks.machine import gpu_memory_mb
from benchmarks.parity import server_parity
from benchmarks.server import peak_rss_mb, start_server, stop_server, wait_ready
from benchmarks.texts import make_texts

ORT_GPU_MISSING = ("not run: onnxruntime-gpu is not installed on this machine (pip install onnxruntime-gpu to "
                   "measure it); its onnxruntime has providers {providers}")


def spec_for(backend: str, model_path: Path, device: str, dtype: str) -> tuple[dict | None, str | None]:
    """The served spec, or None and why it cannot run here. ``auto``: the folder alone, every other choice
    (device, backend, dtype) left to the server's defaults, as a user who configures nothing gets it."""
    if backend == "auto":
        return {"path": str(model_path)}, None
    if backend == "torch":
        return {"path": str(model_path), "backend": "torch", "device": device, "dtype": dtype}, None
    if backend != "onnx":
        raise SystemExit(f"unknown backend {backend!r} (torch, onnx)")
    import onnxruntime

    providers = onnxruntime.get_available_providers()
    if device.startswith("cuda") and "CUDAExecutionProvider" not in providers:
        return None, ORT_GPU_MISSING.format(providers=providers)
    folder = ensure_onnx(model_path)  # exported once (fp32 + int8) under .venv/models/
    if dtype in ("float16", "fp16"):
        ensure_onnx_fp16(folder)
    return {"path": str(folder), "backend": "onnx", "device": device, "dtype": dtype}, None


def entry_key(name: str, args) -> str:
    """The result's key for backend ``name``: ``torch:float16@cuda``, or ``auto (defaults)``."""
    return "auto (defaults)" if name == "auto" else f"{name}:{args.dtype}@{args.device}"


def run_backend(name: str, args, model_path: Path, reference: dict, budget: Budget, pool, result: dict,
                write) -> None:
    """Measure backend ``name`` with the options of ``args`` into ``result["backends"]``, calling ``write``
    after each step so a run cut short keeps what it measured."""
    key = entry_key(name, args)
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
            proc = start_server([{**spec, "name": "bench"}], args.port, args.threads, {})
            entry["start_to_ready_s"] = round(wait_ready(url, proc, timeout=min(120.0, budget.left())), 2)
            import httpx

            entry["card"] = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
            probe = httpx.post(url + "/v1/embeddings", json={"input": "probe", "model": "bench"}, timeout=60)
            dim = len(probe.json()["data"][0]["embedding"])
        providers = entry["card"].get("providers")
        entry["served"] = {k: entry["card"].get(k) for k in ("backend", "device", "dtype", "backend_reason")}
        print(f"{key}: served as {json.dumps(entry['served'])}", flush=True)
        if name == "onnx" and args.device.startswith("cuda") and (not providers or providers[0] != "CUDAExecutionProvider"):
            entry["status"] = f"not run: ONNX Runtime fell back to {providers} (CUDA provider failed to load)"
            return
        with budget.phase(f"{key}: parity"):
            entry["parity"] = server_parity(url, reference)
        print(json.dumps(entry["parity"]), flush=True)
        write()
        entry["http"], entry["skipped cells"] = [], []
        with budget.phase(f"{key}: http cells"):
            for kind in args.texts:
                texts = make_texts(kind, 2048)
                counts = token_counts_for(model_path, texts)
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
        entry["server_peak_rss_mb"] = peak_rss_mb(proc.pid)
        entry["server_gpu_mb"] = gpu_memory_mb(proc.pid) if args.device.startswith("cuda") else None
    finally:
        if proc is not None:
            stop_server(proc)
    inproc_duration = min(args.duration, 2.0)
    estimate = 15 + len(args.texts) * len(args.batch) * 2 * (inproc_duration + 0.5)
    if args.no_inprocess:
        entry["inprocess"] = "not run: --no-inprocess"
    elif not budget.allows(estimate):
        entry["inprocess"] = f"not run: deadline (needs ≈{estimate:.0f} s)"
    else:
        with budget.phase(f"{key}: in-process cells"):
            entry["inprocess"] = inprocess_cells(spec, args.texts, args.batch, inproc_duration, args.threads)
    entry["status"] = "ok" if not entry["skipped cells"] else "partial: deadline"
