"""Sample media (PIL shapes, sine waves, WAV bytes, data URIs) and a loopback HTTP server that serves it
(fixed routes on 127.0.0.1, a free port; optional delays, dribbled bodies or headers, TLS): the media
benchmark and the multi-modal tests both use them."""

from __future__ import annotations

import base64
import io
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from benchmarks.loopback import Handler, LoopbackServer


def png(size=(40, 30), color=(255, 0, 0), mode="RGB", shape: str | None = "circle") -> bytes:
    from PIL import Image, ImageDraw

    image = Image.new(mode, size, color if mode != "L" else 128)
    if shape:
        draw = ImageDraw.Draw(image)
        w, h = size
        box = (w // 4, h // 4, 3 * w // 4, 3 * h // 4)
        fill = (0, 0, 255) if mode == "RGB" else (0, 0, 255, 255) if mode == "RGBA" else 10
        (draw.ellipse if shape == "circle" else draw.rectangle)(box, fill=fill)
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def sine(freq: float, seconds: float, rate: int = 16000, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    wave = (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return wave if channels == 1 else np.stack([wave] * channels, axis=1)


def audio_bytes(samples: np.ndarray, rate: int = 16000, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, samples, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def data_uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(data).decode("ascii")


@dataclass
class Route:
    body: bytes = b""
    content_type: str = "application/octet-stream"
    status: int = 200
    headers: dict = field(default_factory=dict)
    delay_s: float = 0.0  # before the headers
    dribble_s: float = 0.0  # between body bytes
    chunked: bool = False  # no Content-Length
    header_dribble_s: float = 0.0  # between bytes of the status line and headers (a slow-loris server)


class MediaServer:
    """``http.server`` on 127.0.0.1 (a free port) with fixed routes; records every request it gets."""

    def __init__(self, tls: tuple[str, str] | None = None) -> None:
        """``tls``: (certificate, key) PEM files: serve HTTPS and record the SNI names clients send."""
        self.routes: dict[str, Route] = {}
        self.requests: list[tuple[str, str]] = []  # (path, Host header)
        self.sni: list[str | None] = []
        outer = self

        class MediaHandler(Handler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 - http.server's naming
                outer.requests.append((self.path, self.headers.get("Host", "")))
                route = outer.routes.get(self.path)
                if route is None:
                    route = Route(b"not found", "text/plain", 404)
                try:
                    if route.delay_s:
                        time.sleep(route.delay_s)
                    if route.header_dribble_s:
                        self._dribble_headers(route)
                        return
                    self.send_response(route.status)
                    self.send_header("Content-Type", route.content_type)
                    for k, v in route.headers.items():
                        self.send_header(k, v)
                    if route.chunked or route.dribble_s:
                        self.send_header("Connection", "close")
                    else:
                        self.send_header("Content-Length", str(len(route.body)))
                    self.end_headers()
                    if route.dribble_s:
                        for i in range(len(route.body)):
                            self.wfile.write(route.body[i : i + 1])
                            self.wfile.flush()
                            time.sleep(route.dribble_s)
                    else:
                        self.wfile.write(route.body)
                    if route.chunked or route.dribble_s:
                        self.close_connection = True
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _dribble_headers(self, route: Route) -> None:
                head = (f"HTTP/1.1 {route.status} OK\r\nContent-Type: {route.content_type}\r\n"
                        f"X-Padding: {'p' * 200}\r\nContent-Length: {len(route.body)}\r\n\r\n").encode()
                for i in range(len(head)):  # bounded: ~230 bytes, then the body
                    self.wfile.write(head[i : i + 1])
                    self.wfile.flush()
                    time.sleep(route.header_dribble_s)
                self.wfile.write(route.body)
                self.close_connection = True

        self._http = LoopbackServer(MediaHandler, name="media-server")
        self.port = self._http.port
        self.base = self._http.url
        if tls is not None:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            context.sni_callback = lambda sock, name, ctx: self.sni.append(name)
            self._http.server.socket = context.wrap_socket(self._http.server.socket, server_side=True)
            self.base = f"https://127.0.0.1:{self.port}"

    def add(self, path: str, route: Route) -> str:
        self.routes[path] = route
        return self.base + path

    @contextmanager
    def running(self):
        with self._http:
            yield self


#: the synthetic photos' sizes (width, height): camera-like landscape and portrait, square, small
PHOTO_SIZES = ((640, 480), (480, 640), (512, 512), (320, 240))


def photo_uris(n: int, seed: int = 0) -> list[str]:
    """``n`` deterministic JPEG data URIs of the sizes in ``PHOTO_SIZES`` (in turn): a colour gradient with a
    few filled shapes, so each image decodes and preprocesses like a photo of its size."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    uris = []
    for i in range(n):
        w, h = PHOTO_SIZES[i % len(PHOTO_SIZES)]
        a, b = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
        ramp = np.linspace(0, 1, w)[None, :, None]
        pixels = (a + (b - a) * ramp) * np.ones((h, 1, 1))
        image = Image.fromarray(pixels.astype(np.uint8), "RGB")
        draw = ImageDraw.Draw(image)
        for _ in range(4):
            x0, y0 = int(rng.integers(0, w - 40)), int(rng.integers(0, h - 40))
            box = (x0, y0, x0 + int(rng.integers(20, w // 2)), y0 + int(rng.integers(20, h // 2)))
            color = tuple(int(c) for c in rng.integers(0, 256, 3))
            (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=color)
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=90)
        uris.append(data_uri(buf.getvalue(), "image/jpeg"))
    return uris
