"""A stand-in for the Lambda Runtime API on 127.0.0.1, for AWS's own runtime interface client
(``python -m awslambdaric handler.handler``, what the Lambda Python base image runs): the Lambda
cold-start measurement (``scripts/coldstart_lambda.py``) and the tests of the handler under that client
use it.

It speaks the endpoints the client uses (https://docs.aws.amazon.com/lambda/latest/dg/runtimes-api.html):

- ``GET  /2018-06-01/runtime/invocation/next``: the next queued event, with the ``Lambda-Runtime-*``
  headers (request id, deadline in epoch ms, function ARN, trace id). With none queued it waits (at
  most ``idle_timeout`` seconds, then answers 500, which ends the client's loop): the callers queue a
  fixed list of events and stop the process themselves.
- ``POST /2018-06-01/runtime/invocation/{id}/response`` and ``.../{id}/error``: recorded per request id.
- ``POST /2018-06-01/runtime/init/error``: recorded; a second one is answered 403, as Lambda does when
  another worker of a multi-concurrency environment reported first.
- ``GET /2018-06-01/runtime/restore/next`` (SnapStart: with ``AWS_LAMBDA_INITIALIZATION_TYPE=snap-start``
  the client calls it after init and its before-snapshot hooks; Lambda takes the snapshot while the call
  is pending and answers it in a restored environment): recorded, and held until :meth:`RuntimeAPI.restore`
  when the stand-in was made with ``hold_restore=True`` (the moment the snapshot would be taken), else
  answered at once. ``POST /2018-06-01/runtime/restore/error`` (an after-restore hook failed): recorded.

``RuntimeProcess`` runs the client in a subprocess against it, with the handler's folder as
``LAMBDA_TASK_ROOT`` (and the working directory, as in the image) and the repository on ``PYTHONPATH``; or,
for a built zip package, another interpreter (the runtime's Python) with the package as the task root and
that interpreter's runtime client on ``PYTHONPATH`` (as the managed runtime keeps its own outside the task
root).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.loopback import Handler, LoopbackServer

PREFIX = "/2018-06-01/runtime"
FUNCTION_ARN = "arn:aws:lambda:us-east-1:123456789012:function:tessera"


@dataclass
class Outcome:
    request_id: str
    kind: str  # "response" | "error"
    body: Any
    headers: dict[str, str]
    handed_out_ms: int  # when GET /next returned the event (epoch ms)
    posted_ms: int  # when the client posted the outcome
    deadline_ms: int
    size: int = 0  # bytes of the posted body, as the client sent them (what Lambda's 6 MB limit counts)


@dataclass
class _Pending:
    request_id: str
    event: dict
    deadline_ms: int | None
    timeout_ms: int
    done: threading.Event = field(default_factory=threading.Event)
    handed_out_ms: int = 0
    outcome: Outcome | None = None


class RuntimeAPI:
    def __init__(self, idle_timeout: float = 120.0, *, hold_restore: bool = False):
        self.idle_timeout = idle_timeout
        #: set when the client asked for /restore/next (its init and before-snapshot hooks are done)
        self.snapshot_requested = threading.Event()
        #: what the client had asked of the API when it asked for /restore/next
        self.next_calls_at_snapshot: int | None = None
        self.restore_errors: list[dict] = []
        self._restored = threading.Event()
        if not hold_restore:
            self._restored.set()
        self._queue: "queue.Queue[_Pending]" = queue.Queue()
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self.init_errors: list[dict] = []
        self.init_error_headers: list[dict[str, str]] = []
        self.next_calls = 0
        self._init_error_seen = threading.Event()
        self._http = LoopbackServer(self._handler_class(), name="runtime-api")

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``, the client's ``AWS_LAMBDA_RUNTIME_API``"""
        return self._http.address

    def __enter__(self) -> "RuntimeAPI":
        self._http.start()
        return self

    def __exit__(self, *exc) -> None:
        self._restored.set()  # a held /restore/next ends with the stand-in
        self._http.close()

    # --- what the callers use --------------------------------------------------------------------
    def submit(self, event: dict, *, timeout_ms: int = 30_000, deadline_ms: int | None = None) -> _Pending:
        """Queue an event. ``timeout_ms`` is the function timeout: the deadline is set when the event is
        handed out (as Lambda's is at the invocation's start), unless ``deadline_ms`` fixes it."""
        pending = _Pending(str(uuid.uuid4()), event, deadline_ms, timeout_ms)
        with self._lock:
            self._pending[pending.request_id] = pending
        self._queue.put(pending)
        return pending

    def invoke(self, event: dict, *, timeout: float = 120.0, **kwargs) -> Outcome:
        pending = self.submit(event, **kwargs)
        return self.wait(pending, timeout)

    @staticmethod
    def wait(pending: _Pending, timeout: float = 120.0) -> Outcome:
        if not pending.done.wait(timeout):
            raise TimeoutError(f"no response for request {pending.request_id} within {timeout} s")
        assert pending.outcome is not None
        return pending.outcome

    def wait_init_error(self, timeout: float) -> bool:
        return self._init_error_seen.wait(timeout)

    def wait_snapshot(self, timeout: float) -> bool:
        """Wait until the client asks for /restore/next (SnapStart: the snapshot would be taken now)."""
        return self.snapshot_requested.wait(timeout)

    def restore(self) -> None:
        """Answer the pending /restore/next: the client goes on as in a restored environment."""
        self._restored.set()

    # --- the HTTP side ---------------------------------------------------------------------------
    def _handler_class(self):
        api = self

        class RuntimeHandler(Handler):
            protocol_version = "HTTP/1.1"

            def _read(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def do_GET(self) -> None:
                if self.path == f"{PREFIX}/restore/next":
                    api.next_calls_at_snapshot = api.next_calls
                    api.snapshot_requested.set()
                    if not api._restored.wait(api.idle_timeout):
                        self.reply(500, b'{"errorMessage":"the stand-in was not told to restore"}')
                        return
                    self.reply(200, b"")
                    return
                if self.path != f"{PREFIX}/invocation/next":
                    self.reply(404, b'{"errorMessage":"not found"}')
                    return
                api.next_calls += 1
                try:
                    pending = api._queue.get(timeout=api.idle_timeout)
                except queue.Empty:
                    self.reply(500, b'{"errorMessage":"the stand-in has no more events"}')
                    return
                now = int(time.time() * 1000)
                pending.handed_out_ms = now
                if pending.deadline_ms is None:
                    pending.deadline_ms = now + pending.timeout_ms
                body = json.dumps(pending.event).encode()
                self.reply(200, body, {
                    "Content-Type": "application/json",
                    "Lambda-Runtime-Aws-Request-Id": pending.request_id,
                    "Lambda-Runtime-Deadline-Ms": str(pending.deadline_ms),
                    "Lambda-Runtime-Invoked-Function-Arn": FUNCTION_ARN,
                    "Lambda-Runtime-Trace-Id": f"Root=1-{now // 1000:08x}-{uuid.uuid4().hex[:24]};Sampled=0",
                })

            def do_POST(self) -> None:
                body = self._read()
                now = int(time.time() * 1000)
                parts = self.path.removeprefix(PREFIX + "/").split("/")
                if parts == ["init", "error"]:
                    first = not api.init_errors
                    api.init_errors.append(json.loads(body or b"null"))
                    api.init_error_headers.append(dict(self.headers))
                    api._init_error_seen.set()
                    self.reply(202 if first else 403, b'{"status":"OK"}')
                    return
                if parts == ["restore", "error"]:
                    api.restore_errors.append(json.loads(body or b"null"))
                    self.reply(202, b'{"status":"OK"}')
                    return
                if len(parts) == 3 and parts[0] == "invocation" and parts[2] in ("response", "error"):
                    with api._lock:
                        pending = api._pending.get(parts[1])
                    if pending is None or pending.done.is_set():
                        self.reply(400, b'{"errorMessage":"unknown or finished request id"}')
                        return
                    pending.outcome = Outcome(parts[1], parts[2], json.loads(body or b"null"), dict(self.headers),
                                              pending.handed_out_ms, now, pending.deadline_ms or 0, len(body or b""))
                    pending.done.set()
                    self.reply(202, b'{"status":"OK"}')
                    return
                self.reply(404, b'{"errorMessage":"not found"}')

        return RuntimeHandler


class RuntimeProcess:
    """``python -m awslambdaric handler.handler`` in its own process group, against ``api``."""

    def __init__(self, api: RuntimeAPI, task_root: Path, repo_root: Path | None, env: dict[str, str] | None = None,
                 handler: str = "handler.handler", *, python: str = sys.executable, pythonpath: Path | None = None):
        self.api = api
        self.started = time.monotonic()
        environment = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/tmp"),
            "AWS_LAMBDA_RUNTIME_API": api.address,
            "LAMBDA_TASK_ROOT": str(task_root),
            "PYTHONPATH": str(pythonpath or repo_root),
            "AWS_LAMBDA_FUNCTION_NAME": "tessera",
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1769",
            "AWS_REGION": "us-east-1",
            "AWS_EXECUTION_ENV": "AWS_Lambda_python3.12",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            **(env or {}),
        }
        self.proc = subprocess.Popen([python, "-m", "awslambdaric", handler], cwd=task_root, env=environment,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self._out: list[bytes] = []
        self._err: list[bytes] = []
        self._readers = [threading.Thread(target=self._drain, args=(self.proc.stdout, self._out), daemon=True),
                         threading.Thread(target=self._drain, args=(self.proc.stderr, self._err), daemon=True)]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _drain(stream, sink: list[bytes]) -> None:
        for line in iter(stream.readline, b""):
            sink.append(line)

    @property
    def stdout(self) -> str:
        return b"".join(self._out).decode("utf-8", "replace")

    @property
    def stderr(self) -> str:
        return b"".join(self._err).decode("utf-8", "replace")

    def wait_for_output(self, needle: str, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if needle in self.stdout:
                return True
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the readers finish
                return needle in self.stdout
            time.sleep(0.05)
        return False

    def children(self) -> list[int]:
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout)
        for reader in self._readers:
            reader.join(timeout)
        return self.proc.returncode

    def __enter__(self) -> "RuntimeProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def mapped_files(pid: int) -> set[str]:
    """The files mapped into a process (its shared libraries among them), from /proc/PID/maps."""
    names = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            names.add(parts[5])
    return names
