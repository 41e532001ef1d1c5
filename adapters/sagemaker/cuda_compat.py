"""CUDA forward compatibility for the CUDA image, decided at container start.

The image's torch and onnxruntime-gpu wheels are CUDA 13 builds. A host whose NVIDIA driver is older
than CUDA 13 needs (data-centre GPUs only) the user-mode driver of NVIDIA's ``cuda-compat`` package,
which the image carries in ``/usr/local/cuda/compat``; a host with a newer driver must *not* load it
(an older compat ``libcuda`` in front of a newer kernel driver fails). So the entrypoint compares the
kernel driver's version (``/proc/driver/nvidia/version``) with the compat driver's (the version in
the name ``libcuda.so.1`` points to) and puts the compat folder first on ``LD_LIBRARY_PATH`` only
when the host's is older. The CUDA libraries that pip installed (``site-packages/nvidia/*/lib``) are
put on the path too, so ONNX Runtime's CUDA provider finds them whether or not torch was imported
first. ``LD_LIBRARY_PATH`` is read by the loader when a process starts: the entrypoint sets it, then
replaces itself with the command (``serve``).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Mapping

COMPAT_DIR = Path("/usr/local/cuda/compat")
DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def host_driver_version(version_file: Path = DRIVER_VERSION_FILE) -> tuple[int, ...] | None:
    """``NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  ...`` → (535, 183, 1); None without a GPU."""
    try:
        text = version_file.read_text()
    except OSError:
        return None
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", text)
    return _version(found.group(1)) if found else None


def compat_driver_version(compat_dir: Path = COMPAT_DIR) -> tuple[int, ...] | None:
    """``libcuda.so.1 -> libcuda.so.580.95.05`` → (580, 95, 5); None when the compat package is absent."""
    link = compat_dir / "libcuda.so.1"
    try:
        target = os.readlink(link)
    except OSError:
        return None
    found = re.search(r"libcuda\.so\.(\d+(?:\.\d+)+)$", target)
    return _version(found.group(1)) if found else None


def needs_compat(host: tuple[int, ...] | None, compat: tuple[int, ...] | None) -> bool:
    """Only a known host driver older than the compat driver gets the compat libraries."""
    return host is not None and compat is not None and host < compat


def pip_cuda_lib_dirs(site_packages: list[Path]) -> list[Path]:
    found: list[Path] = []
    for root in site_packages:
        found += sorted(p for p in (root / "nvidia").glob("*/lib") if p.is_dir())
    return found


def library_path(environ: Mapping[str, str], *, compat_dir: Path = COMPAT_DIR,
                 version_file: Path = DRIVER_VERSION_FILE, site_packages: list[Path] | None = None) -> tuple[str, str]:
    """(the new LD_LIBRARY_PATH, a one-line reason for the log)."""
    host, compat = host_driver_version(version_file), compat_driver_version(compat_dir)
    parts = [p for p in environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    extra = [str(p) for p in pip_cuda_lib_dirs(site_packages if site_packages is not None else
                                               [Path(p) for p in sys.path if p.endswith("site-packages")])]
    if needs_compat(host, compat):
        reason = f"host driver {_fmt(host)} < compat driver {_fmt(compat)}: using {compat_dir}"
        extra.insert(0, str(compat_dir))
    elif compat is None:
        reason = f"no CUDA compat package in {compat_dir}"
    elif host is None:
        reason = "no NVIDIA kernel driver found (no GPU?): CUDA compat not used"
    else:
        reason = f"host driver {_fmt(host)} >= compat driver {_fmt(compat)}: CUDA compat not used"
    merged = extra + [p for p in parts if p not in extra]
    return ":".join(merged), reason


def _fmt(version: tuple[int, ...] | None) -> str:
    return ".".join(map(str, version or ()))


def main(argv: list[str]) -> None:
    """``entrypoint COMMAND [ARGS...]``: set LD_LIBRARY_PATH, then exec COMMAND (default: serve)."""
    command = argv or ["serve"]
    environ = dict(os.environ)
    compat_dir = Path(environ.get("TESSERA_CUDA_COMPAT_DIR", str(COMPAT_DIR)))
    version_file = Path(environ.get("TESSERA_NVIDIA_VERSION_FILE", str(DRIVER_VERSION_FILE)))
    environ["LD_LIBRARY_PATH"], reason = library_path(environ, compat_dir=compat_dir, version_file=version_file)
    print(f"tessera entrypoint: {reason}", file=sys.stderr, flush=True)
    os.execvpe(command[0], command, environ)
