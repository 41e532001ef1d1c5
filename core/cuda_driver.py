"""Can this host's NVIDIA driver run the installed torch's CUDA build? Decided at container start (the
SageMaker CUDA image's entrypoint, the Modal class's restore hook), so that a driver that cannot run it
stops the start with a message naming the fix, instead of every request failing later.

Imports nothing heavy (no torch import: the build's CUDA version is read from ``torch/version.py``), so
the SageMaker entrypoint can run it before it execs the server.

The rules, and where they come from:

- A CUDA build of major version M runs natively on a driver of branch ``MIN_DRIVER_BRANCH[M]`` or newer
  (NVIDIA, CUDA Toolkit release notes, "CUDA Toolkit and Minimum Required Driver Version for CUDA Minor
  Version Compatibility": CUDA 12.x needs >= 525, CUDA 13.x >= 580).
- On an older *data-centre* driver, NVIDIA's forward-compatibility package (``cuda-compat``, the user-mode
  driver of the newer branch) runs it, but only on the driver branches NVIDIA supports for it
  (NVIDIA, "CUDA Compatibility", Forward Compatibility; and the data-centre driver support matrix,
  "Supported Drivers and CUDA Toolkit Versions": below R580 it lists R535 (LTSB) and R570; every other
  earlier branch, R575, R565, R560, R550, R470 included, is end of life). ``FORWARD_COMPAT_BRANCHES``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from dataclasses import dataclass
from pathlib import Path

DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
#: the oldest driver branch that runs a CUDA major version without forward compatibility
MIN_DRIVER_BRANCH = {12: 525, 13: 580}
#: the older driver branches on which NVIDIA's forward-compatibility package runs that CUDA major version
FORWARD_COMPAT_BRANCHES = {13: frozenset({535, 570})}

Version = tuple[int, ...]


def parse_version(text: str) -> Version:
    return tuple(int(part) for part in text.split("."))


def fmt(version: Version | None) -> str:
    return ".".join(map(str, version)) if version else "none"


def host_driver_version(version_file: Path = DRIVER_VERSION_FILE) -> Version | None:
    """``NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  ...`` → (535, 183, 1); None without a GPU."""
    try:
        text = Path(version_file).read_text()
    except OSError:
        return None
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", text)
    return parse_version(found.group(1)) if found else None


def torch_cuda_version(site_packages: list[Path] | None = None) -> Version | None:
    """The CUDA version torch was built for ((13, 0)), None for a CPU build or no torch. torch already
    imported: ``torch.version.cuda``; else read from ``torch/version.py`` (in ``site_packages`` when given)
    without importing torch."""
    torch = sys.modules.get("torch")
    if torch is not None and site_packages is None:
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        return parse_version(cuda) if cuda else None
    if site_packages is not None:
        files = [root / "torch" / "version.py" for root in site_packages]
    else:
        spec = importlib.util.find_spec("torch")
        files = [Path(p) / "version.py" for p in (spec.submodule_search_locations or [])] if spec else []
    for file in files:
        try:
            text = file.read_text()
        except OSError:
            continue
        found = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"](\d+(?:\.\d+)*)['\"]", text, re.M)
        return parse_version(found.group(1)) if found else None
    return None


@dataclass(frozen=True)
class DriverCheck:
    host: Version | None      # the kernel driver's version, None without one
    cuda: Version | None      # the CUDA version of the build, None when there is none
    compat: bool              # whether the forward-compatibility libraries are to be used
    problem: str | None       # why the driver cannot run the build (with the fix), or None

    def line(self) -> str:
        """One log line: the versions and the decision."""
        how = ("refused" if self.problem else "through CUDA forward compatibility" if self.compat
               else "natively" if self.host and self.cuda else "not checked")
        return f"NVIDIA driver {fmt(self.host)}, torch CUDA build {fmt(self.cuda)}: {how}"


def check_driver(host: Version | None, cuda: Version | None, *, compat_available: bool, fix: str) -> DriverCheck:
    """Whether a driver ``host`` runs a build for CUDA ``cuda``: natively (its branch is new enough), through
    the forward-compatibility libraries (``compat_available``, on a branch NVIDIA supports for it), or
    not at all: then ``problem`` says so and ends with ``fix``. No driver or no CUDA build: nothing to
    check (a CPU start, or torch's own error later)."""
    if host is None or cuda is None:
        return DriverCheck(host, cuda, False, None)
    major, branch = cuda[0], host[0]
    least = MIN_DRIVER_BRANCH.get(major)
    if least is None or branch >= least:
        return DriverCheck(host, cuda, False, None)
    supported = FORWARD_COMPAT_BRANCHES.get(major, frozenset())
    if branch in supported and compat_available:
        return DriverCheck(host, cuda, True, None)
    why = (f"the NVIDIA driver {fmt(host)} (branch {branch}) cannot run torch's CUDA {fmt(cuda)} build: it needs "
           f"driver branch >= {least}")
    if supported:
        branches = ", ".join(map(str, sorted(supported)))
        why += (f", or NVIDIA's forward-compatibility package on branch {branches} (data-centre GPUs)"
                + ("" if compat_available else "; this image has no forward-compatibility libraries"))
    return DriverCheck(host, cuda, False, f"{why}. Fix: {fix}")
