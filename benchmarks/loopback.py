"""An HTTP server on 127.0.0.1 (a free port), served from a thread: the one start and stop of the loopback
stand-ins (``media``'s media server, ``lambda_runtime``'s Runtime API; in the tests, the Hugging Face Hub
and the OTLP collector). It binds loopback only. And ``free_port``, for a server started in another
process."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOST = "127.0.0.1"


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now (for a server process to bind next)."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Handler(BaseHTTPRequestHandler):
    """A request handler without the access log; ``reply`` sends a whole answer with its Content-Length."""

    def log_message(self, *args) -> None:  # quiet
        pass

    def reply(self, status: int, body: bytes = b"", headers: Mapping[str, str] | None = None, *,
              send_body: bool = True) -> None:
        """``send_body=False`` (an answer to HEAD): the headers only, Content-Length still the body's."""
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):  # a client that hung up is expected
            super().handle_error(request, client_address)


class LoopbackServer:
    """``handler`` on 127.0.0.1:<free port>, bound at construction (the port is known before it serves),
    served by a daemon thread from ``start()`` to ``close()``; ``with`` does both."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, name: str = "loopback"):
        self.server = _Server((HOST, 0), handler)
        self.port: int = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name=name, daemon=True)

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``"""
        return f"{HOST}:{self.port}"

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``"""
        return f"http://{self.address}"

    def start(self) -> "LoopbackServer":
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever: only once it runs
            self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> "LoopbackServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
