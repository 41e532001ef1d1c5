"""CUDA forward compatibility for the CUDA image, decided at container start.

The image's torch and onnxruntime-gpu wheels are CUDA 13 builds, which need a host driver of branch 580
or newer. On an older *data-centre* driver of a branch NVIDIA supports for it (535 or 570 for CUDA 13),
the user-mode driver of NVIDIA's ``cuda-compat`` package, which the image carries in
``/usr/local/cuda/compat``, runs them; on any other branch (470, 550, 575, ...) nothing does, and the
entrypoint stops the container at once with a message naming the fix (an ``InferenceAmiVersion`` whose
driver is 580: ``al2023-ami-sagemaker-inference-gpu-4-1``), instead of a server whose every CUDA call
fails and whose ``/ping`` stays 503 until the endpoint's start-up times out. The rules are
``core.cuda_driver``'s, shared with the Modal app. A host on branch 580 or newer must *not* load the
compat libraries (an older compat ``libcuda`` in front of a newer kernel driver fails). The kernel
driver's version comes from ``/proc/driver/nvidia/version``, the compat driver's from the name
``libcuda.so.1`` points to, the build's CUDA version from torch's ``version.py`` (torch is not imported).
The CUDA libraries that pip installed (``site-packages/nvidia/*/lib``) are put on the path too, so ONNX
Runtime's CUDA provider finds them whether or not torch was imported first. ``LD_LIBRARY_PATH`` is read by
the loader when a process starts: the entrypoint sets it, then replaces itself with the command (``serve``).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Mapping

from core.cuda_driver import DRIVER_VERSION_FILE, check_driver, fmt, host_driver_version, torch_cuda_version
from core.cuda_driver import parse_version as _version

COMPAT_DIR = Path("/usr/local/cuda/compat")
#: what fixes a driver the image's CUDA build cannot use on SageMaker (botocore's ProductionVariant
#: InferenceAmiVersion documentation: al2023-ami-sagemaker-inference-gpu-4-1 is NVIDIA driver 580, CUDA 13.0)
SAGEMAKER_FIX = ("deploy with InferenceAmiVersion=al2023-ami-sagemaker-inference-gpu-4-1 (NVIDIA driver 580) on the "
                 "production variant (infra/sagemaker/endpoint.yaml's InferenceAmiVersion parameter, its default); "
                 "the default AMIs run driver 470 (ml.g5, ml.g4dn, ml.p4d) or 535/550 (ml.g6, ml.p5)")


class DriverRefused(RuntimeError):
    """The host's driver cannot run the image's CUDA build: the container must not start."""


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
    """Only a known host driver of an older branch than the compat driver's gets the compat libraries."""
    return host is not None and compat is not None and host[0] < compat[0]


def pip_cuda_lib_dirs(site_packages: list[Path]) -> list[Path]:
    found: list[Path] = []
    for root in site_packages:
        found += sorted(p for p in (root / "nvidia").glob("*/lib") if p.is_dir())
    return found


def library_path(environ: Mapping[str, str], *, compat_dir: Path = COMPAT_DIR,
                 version_file: Path = DRIVER_VERSION_FILE, site_packages: list[Path] | None = None) -> tuple[str, str]:
    """(the new LD_LIBRARY_PATH, a one-line reason for the log). Raises ``DriverRefused`` when the host's
    driver cannot run the build, with or without the compat libraries."""
    roots = site_packages if site_packages is not None else [Path(p) for p in sys.path if p.endswith("site-packages")]
    host, compat = host_driver_version(version_file), compat_driver_version(compat_dir)
    cuda = torch_cuda_version(roots)
    parts = [p for p in environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    extra = [str(p) for p in pip_cuda_lib_dirs(roots)]
    check = check_driver(host, cuda, compat_available=compat is not None, fix=SAGEMAKER_FIX)
    if check.problem:
        raise DriverRefused(f"{check.line()}: {check.problem}")
    use_compat = check.compat if cuda is not None else needs_compat(host, compat)
    if use_compat:
        reason = f"host driver {fmt(host)} < compat driver {fmt(compat)}: using {compat_dir}"
        extra.insert(0, str(compat_dir))
    elif compat is None:
        reason = f"no CUDA compat package in {compat_dir}"
    elif host is None:
        reason = "no NVIDIA kernel driver found (no GPU?): CUDA compat not used"
    else:
        reason = f"host driver {fmt(host)} >= compat driver branch {compat[0]}: CUDA compat not used"
    merged = extra + [p for p in parts if p not in extra]
    return ":".join(merged), f"{reason} ({check.line()})"


def main(argv: list[str]) -> None:
    """``entrypoint COMMAND [ARGS...]``: set LD_LIBRARY_PATH, then exec COMMAND (default: serve); exit 1 when
    the host's driver cannot run the image's CUDA build."""
    command = argv or ["serve"]
    environ = dict(os.environ)
    compat_dir = Path(environ.get("TESSERA_CUDA_COMPAT_DIR", str(COMPAT_DIR)))
    version_file = Path(environ.get("TESSERA_NVIDIA_VERSION_FILE", str(DRIVER_VERSION_FILE)))
    try:
        environ["LD_LIBRARY_PATH"], reason = library_path(environ, compat_dir=compat_dir, version_file=version_file)
    except DriverRefused as exc:
        print(f"tessera entrypoint: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    print(f"tessera entrypoint: {reason}", file=sys.stderr, flush=True)
    os.execvpe(command[0], command, environ)
