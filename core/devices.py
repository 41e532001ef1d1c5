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


def is_device_list(device: str) -> bool:
    """A spec's ``device`` names several devices (``cuda:0,cuda:1``, ``cuda:*``, ``cpu:0,cpu:1``): one executor
    process per device serves it."""
    return "," in device or device.endswith(":*") or (device.startswith("cpu:") and device[4:].isdigit())


def visible_gpus(environ: Mapping[str, str], root: Path = Path("/")) -> list[int]:
    """The indices torch would number 0… for the GPUs this process may use: as many as
    ``CUDA_VISIBLE_DEVICES`` names (when set), else as many as the driver lists. No torch import."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        names = [v.strip() for v in visible.split(",") if v.strip()]
        if names in ([], ["-1"], ["none"], ["NoDevFiles"]):
            return []
        return list(range(len(names)))
    gpus = root / "proc" / "driver" / "nvidia" / "gpus"
    count = len(list(gpus.iterdir())) if gpus.is_dir() else 0
    if not count:
        count = sum(1 for p in (root / "dev").glob("nvidia[0-9]*") if p.name[len("nvidia"):].isdigit())
    return list(range(count))


def expand_devices(device: str, environ: Mapping[str, str], root: Path = Path("/")) -> list[str]:
    """The devices a spec's ``device`` names, one per executor: ``cuda:*`` → every visible GPU
    (``cuda:0``, ``cuda:1`` …), ``cuda:0,cuda:1`` and ``cpu:0,cpu:1`` as listed (``cpu:N``: an executor of its
    own serving on the CPU), a single device as itself (``cpu`` → ``cpu:0``, ``cuda`` → ``cuda:0``)."""
    out: list[str] = []
    for part in (p.strip() for p in device.split(",")):
        if not part:
            continue
        kind, _, index = part.partition(":")
        if index == "*":
            if kind != "cuda":
                raise ValueError(f"device {device!r}: '*' names every GPU (cuda:*), not every {kind}")
            gpus = visible_gpus(environ, root)
            if not gpus:
                raise ValueError(f"device {device!r}: no GPU is visible (driver list, CUDA_VISIBLE_DEVICES)")
            out += [f"cuda:{i}" for i in gpus]
        elif kind in ("cpu", "cuda") and (index == "" or index.isdigit()):
            out.append(f"{kind}:{index or 0}")
        elif index == "" and "," not in device:
            out.append(part)  # neuron, mps …: one device, one executor
        else:
            raise ValueError(f"device {device!r}: {part!r} is not cpu, cpu:N, cuda, cuda:N or cuda:*")
    if len(set(out)) != len(out):
        raise ValueError(f"device {device!r} names a device twice")
    return out


def is_accelerator(device: str) -> bool:
    """Not the CPU (``cpu``, ``cpu:N``): a GPU, a Neuron core."""
    return not device.startswith("cpu")


def runtime_device(device: str) -> str:
    """What a backend is given for one device of a list: ``cpu:N`` → ``cpu`` (every CPU executor serves on the
    CPU), ``cuda:N`` as is."""
    return device if is_accelerator(device) else "cpu"
