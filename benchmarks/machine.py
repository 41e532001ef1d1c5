"""What machine a benchmark ran on: Python and library versions, CPUs, GPU (torch, nvidia-smi), ONNX Runtime
providers; and a server's GPU memory."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess


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
    smi = nvidia_smi(["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    if smi:
        info["nvidia_smi"] = smi.strip()
    return info


def nvidia_smi(args: list[str]) -> str | None:
    """nvidia-smi's output, or None where it is missing or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_memory_mb(pid: int) -> float | None:
    """The server's GPU memory as nvidia-smi reports it (None where it lists no processes)."""
    out = nvidia_smi(["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
            return float(parts[1])
    return None
