"""``python -m core.healthcheck``: the container's HEALTHCHECK (the root Dockerfile). Asks ``GET /health`` on
127.0.0.1 at the port the server was started with (its ``--port`` on the command line of the container's
main process, else ``TESSERA_PORT`` / ``INFINITY_PORT``, else 8000) and under its ``--url-prefix``; exit 0
when it answers 200, else 1 with the reason on stderr."""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping, Sequence


def _option(argv: Sequence[str], name: str) -> str | None:
    value = None
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def health_url(server_argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """Where the server started with ``server_argv`` answers /health."""
    port = _option(server_argv, "--port") or environ.get("TESSERA_PORT") or environ.get("INFINITY_PORT") or "8000"
    prefix = (_option(server_argv, "--url-prefix") or environ.get("TESSERA_URL_PREFIX")
              or environ.get("INFINITY_URL_PREFIX") or "").strip().rstrip("/")
    if prefix and not prefix.startswith("/"):
        prefix = "/" + prefix
    return f"http://127.0.0.1:{port.strip()}{prefix}/health"


def check(url: str, timeout: float = 4.0) -> str | None:
    """None when ``url`` answers 200, else why not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:  # noqa: S310 - a fixed loopback URL
            return None if answer.status == 200 else f"{url}: HTTP {answer.status}"
    except (urllib.error.URLError, OSError, ValueError) as exc:  # (ValueError: a port that is no number)
        return f"{url}: {exc}"


def main(proc_cmdline: Path = Path("/proc/1/cmdline")) -> int:
    try:
        server_argv = proc_cmdline.read_bytes().split(b"\0")
        argv = [a.decode(errors="replace") for a in server_argv if a]
    except OSError:
        argv = []
    problem = check(health_url(argv, os.environ))
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
