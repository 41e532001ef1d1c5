"""The GPU benchmark's result as the Markdown section of docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

from benchmarks.results import table


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
        served = e.get("served")
        if served:
            lines.append(f"Served as: backend `{served.get('backend')}`, device `{served.get('device')}`, dtype "
                         f"`{served.get('dtype')}`" + (f" — {served['backend_reason']}" if served.get("backend_reason") else "")
                         + ".")
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
        lines.append(table(e.get("http", []), "HTTP, closed loop", level=4))
        if isinstance(e.get("inprocess"), list):
            lines.append(table(e["inprocess"], "In-process (same model, same inputs; no HTTP, no batcher)", level=4))
        elif e.get("inprocess"):
            lines += ["", f"In-process: {e['inprocess']}."]
        lines.append("")
    lines.append("Phases: " + ", ".join(f"{p['phase']} {p['seconds']:.0f} s" for p in result["phases"]) + ".")
    return "\n".join(lines).rstrip() + "\n"


def _num(v) -> str:
    return "n/a" if v is None else f"{v:.0f} MB"
