"""Infinity (``infinity-emb``), the reference server of the comparison: its model folder and its server
process on loopback, with its best CPU settings."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from benchmarks.artifacts import MODELS_DIR


def infinity_folder(model_dir: Path, precision: str, head: str = "encoder") -> Path:
    """A copy of the model folder with the graph of ``head`` Infinity loads at its root (its optimum loader
    wants a file name relative to the folder, so it is started with the folder as working directory)."""
    from core.convert.onnx_export import export_head, quantize_int8

    out = MODELS_DIR / f"infinity-{model_dir.name}-{precision}"
    marker = out / ".complete"
    if marker.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(model_dir, out, ignore=shutil.ignore_patterns("onnx", "*.onnx", ".complete"))
    plain = out / "model.onnx"
    export_head(model_dir, plain, head)
    if precision == "int8":  # Infinity prefers a file whose name contains "quantize"
        quantize_int8(plain, out / "model_quantized.onnx", "fast")
    marker.write_text("ok")
    return out


def start_infinity(binary: str, folder: Path, port: int, precision: str, engine: str = "optimum",
                   extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """``infinity_emb v2`` on 127.0.0.1:``port``: the optimum (ONNX Runtime) engine on CPU, batch size 32,
    serving ``folder`` as "bench" (fp32: the unquantized graph). ``engine="torch"`` (the only engine
    Infinity has for CLIP) loads the folder's torch weights; int8 is then its ``--dtype int8``
    (``torch.quantization.quantize_dynamic`` of the Linear layers). ``extra``: more command-line options."""
    cmd = [binary, "v2", "--model-id", ".", "--served-model-name", "bench", "--engine", engine,
           "--device", "cpu", "--batch-size", "32", "--host", "127.0.0.1", "--port", str(port),
           "--log-level", "warning"]
    if engine == "torch":
        cmd += ["--dtype", "int8" if precision == "int8" else "float32"]
    elif precision == "fp32":
        cmd.append("--onnx-do-not-prefer-quantized")
    cmd += extra
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    return subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
