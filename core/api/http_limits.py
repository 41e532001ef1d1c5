"""The HTTP server's own limits on what arrives before the app sees a request: the request line and
headers together are bounded (``max_header_bytes``; 431 beyond), so a client cannot make the server
buffer a 64 MB header. uvicorn's h11 implementation bounds this itself
(``h11_max_incomplete_event_size``); its httptools implementation, the faster one, does not, so the
bounded protocol counts the bytes of each request's head as they arrive: one request's head, never the
rest of a received chunk (pipelined requests in one read are measured one by one).

Every way of starting Tessera holds the bound:

- ``python -m core serve`` (and so ``scripts/serve``) and SageMaker's ``serve`` pass :func:`http_options`
  to ``uvicorn.run``;
- ``uvicorn core.dev:app`` chooses its protocol before it imports the app, so ``core/dev.py`` (the edge of
  that command) calls :func:`bound_httptools`, which bounds uvicorn's httptools protocol class itself.
"""

from __future__ import annotations

from typing import Any, Callable

#: the protocol methods the bound wraps
_WRAPPED = ("__init__", "on_message_begin", "on_headers_complete", "on_body", "on_message_complete",
            "data_received")


def http_options(max_header_bytes: int) -> dict[str, Any]:
    """uvicorn.run(...) keyword arguments: httptools with the head bounded, else h11 with its own bound."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return {"http": "h11", "h11_max_incomplete_event_size": max_header_bytes}
    return {"http": bounded_httptools_protocol(max_header_bytes), "h11_max_incomplete_event_size": max_header_bytes}


def bounded_httptools_protocol(max_header_bytes: int) -> type:
    """A subclass of uvicorn's httptools protocol with each request's head bounded."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    methods = {} if getattr(HttpToolsProtocol, "_head_bounded", False) else _bounded_methods(
        {name: getattr(HttpToolsProtocol, name) for name in _WRAPPED})  # bounded in place already: the limit only
    return type("BoundedHttpToolsProtocol", (HttpToolsProtocol,), {**methods, "max_header_bytes": max_header_bytes})


def bound_httptools(max_header_bytes: int) -> bool:
    """Bound uvicorn's httptools protocol class in place (for ``uvicorn core.dev:app``, whose server has
    chosen that class before the app module is imported). Calling it again only changes the limit.
    False when httptools is not installed (uvicorn then serves with h11, which bounds heads itself)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return False
    if not getattr(HttpToolsProtocol, "_head_bounded", False):
        for name, method in _bounded_methods({name: getattr(HttpToolsProtocol, name) for name in _WRAPPED}).items():
            setattr(HttpToolsProtocol, name, method)
        HttpToolsProtocol._head_bounded = True
    HttpToolsProtocol.max_header_bytes = max_header_bytes
    return True


def _bounded_methods(base: dict[str, Callable]) -> dict[str, Callable]:
    """The protocol methods that bound each request's head to ``self.max_header_bytes``, each calling
    ``base``'s own method of that name."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        base["__init__"](self, *args, **kwargs)
        self._in_head = False  # between a request's first byte and the end of its headers
        self._heads_begun = 0
        self._head_bytes = 0
        self._refused = False

    def on_message_begin(self) -> None:
        base["on_message_begin"](self)
        self._in_head, self._head_bytes = True, 0
        self._heads_begun += 1

    def on_headers_complete(self) -> None:
        self._in_head = False
        # a head that ends in this read is measured exactly (the request line and every header)
        if _known_head_bytes(self) > self.max_header_bytes:
            _refuse(self)
            return
        base["on_headers_complete"](self)

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            base["on_body"](self, body)

    def on_message_complete(self) -> None:
        if not self._refused:
            base["on_message_complete"](self)

    def data_received(self, data: bytes) -> None:
        carried = self._in_head  # a head still arriving: this read is its own until the head ends
        begun = self._heads_begun
        if carried:
            self._head_bytes += len(data)
        base["data_received"](self, data)
        if not self._in_head or self._refused or self.transport.is_closing():
            return
        if self._heads_begun != begun:
            # the head still arriving began inside this read, after the requests before it in the same
            # read: what is known of it so far (later reads then count whole)
            self._head_bytes = _known_head_bytes(self)
        if self._head_bytes > self.max_header_bytes:
            _refuse(self)

    return {"__init__": __init__, "on_message_begin": on_message_begin, "on_headers_complete": on_headers_complete,
            "on_body": on_body, "on_message_complete": on_message_complete, "data_received": data_received}


def _known_head_bytes(protocol) -> int:
    return len(protocol.url) + sum(len(name) + len(value) + 4 for name, value in protocol.headers)


def _refuse(protocol) -> None:
    from core.api.observability import request_id

    protocol._refused = True
    limit = protocol.max_header_bytes
    body = (b'{"error":{"message":"request line and headers exceed ' + str(limit).encode()
            + b' bytes","type":"invalid_request_error","param":null,"code":"headers_too_large"}}')
    rid = request_id(protocol.headers or ()).encode()  # the caller's, if it arrived before the limit
    protocol.transport.write(
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
        b"x-request-id: " + rid + b"\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
    protocol.transport.close()
    protocol._in_head = False
