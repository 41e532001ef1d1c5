"""The HTTP server's own limits on what arrives before the app sees a request: the request line and
headers together are bounded (``max_header_bytes``; 431 beyond), so a client cannot make the server
buffer a 64 MB header. uvicorn's h11 implementation bounds this itself
(``h11_max_incomplete_event_size``); its httptools implementation, the faster one, does not, so
:class:`BoundedHttpToolsProtocol` counts the bytes of each request's head as they arrive.

Used by ``python -m core serve`` (and so by ``scripts/serve``) through :func:`http_options`."""

from __future__ import annotations

from typing import Any



def http_options(max_header_bytes: int) -> dict[str, Any]:
    """uvicorn.run(...) keyword arguments: httptools with the head bounded, else h11 with its own bound."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return {"http": "h11", "h11_max_incomplete_event_size": max_header_bytes}
    return {"http": bounded_httptools(max_header_bytes), "h11_max_incomplete_event_size": max_header_bytes}


def bounded_httptools(max_header_bytes: int):
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class BoundedHttpToolsProtocol(HttpToolsProtocol):
        """httptools, with each request's head (request line + headers) bounded."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._in_head = False
            self._head_bytes = 0
            self._refused = False

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head, self._head_bytes = True, 0

        def on_headers_complete(self) -> None:
            self._in_head = False
            # a head that arrived in one piece is measured here (the request line and every header)
            size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
            if size > max_header_bytes:
                self._refuse()
                return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            if not self._refused:
                super().on_message_complete()

        def data_received(self, data: bytes) -> None:
            if self._in_head:  # still reading a head: these bytes are its (and maybe its end)
                self._head_bytes += len(data)
            super().data_received(data)
            if self._in_head and not self._refused and not self.transport.is_closing():
                if self._head_bytes == 0:  # the head began inside this chunk
                    self._head_bytes = len(data)
                if self._head_bytes > max_header_bytes:
                    self._refuse()

        def _refuse(self) -> None:
            self._refused = True
            body = (b'{"error":{"message":"request line and headers exceed ' + str(max_header_bytes).encode()
                    + b' bytes","type":"invalid_request_error","param":null,"code":"headers_too_large"}}')
            from core.api.observability import request_id

            rid = request_id(self.headers or ()).encode()  # the caller's, if it arrived before the limit
            self.transport.write(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                b"x-request-id: " + rid + b"\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
            self.transport.close()
            self._in_head = False

    return BoundedHttpToolsProtocol
