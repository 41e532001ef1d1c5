"""``device: auto``: the device a model spec means when it names none.

``auto`` is a CUDA GPU when this process can use one through torch, else the CPU. The check imports
nothing: the NVIDIA driver lists a GPU (``/proc/driver/nvidia/gpus`` or ``/dev/nvidiaN``), none is hidden by
``CUDA_VISIBLE_DEVICES``, and the installed torch is a CUDA build (its ``torch/version.py`` names a CUDA
version). So a CPU machine, or one with the CPU build of torch or none at all, serves on the CPU without
importing torch (the ONNX path); a GPU machine whose torch can drive it serves on ``cuda``.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Mapping

_TORCH_CUDA = re.compile(r"^cuda\s*(?::[^=\n]*)?=\s*['\"]\d", re.MULTILINE)


def driver_lists_a_gpu(root: Path = Path("/")) -> bool:
    """The NVIDIA driver shows at least one GPU to this machine (procfs entry or device node)."""
    gpus = root / "proc" / "driver" / "nvidia" / "gpus"
    if gpus.is_dir() and any(gpus.iterdir()):
        return True
    return any(p.name[len("nvidia"):].isdigit() for p in (root / "dev").glob("nvidia[0-9]*"))


def torch_is_cuda_build() -> bool:
    """The installed torch was built with CUDA, read from its ``version.py`` without importing torch."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return False
    version = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    try:
        return _TORCH_CUDA.search(version.read_text()) is not None
    except OSError:
        return False


def auto_device(environ: Mapping[str, str], root: Path = Path("/")) -> str:
    """``cuda`` when a GPU is listed, not hidden by ``CUDA_VISIBLE_DEVICES`` and torch is a CUDA build; else ``cpu``."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return "cpu"
    return "cuda" if driver_lists_a_gpu(root) and torch_is_cuda_build() else "cpu"
