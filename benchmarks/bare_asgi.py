"""The floor of an embeddings server on this stack: a bare ASGI app under uvicorn (uvloop, httptools) that
reads an OpenAI embeddings request with orjson and answers it with one base64 float32 vector per input
(the same vector, encoded per item), no model, no tokenizer, no middleware. What a real server spends per
request beyond this is its own work.

    BARE_ASGI_DIM=32 python -m uvicorn --factory benchmarks.bare_asgi:from_env --port 8000 ...
"""

from __future__ import annotations

import base64
import os
import subprocess
import sys

from benchmarks import ROOT

JSON = [(b"content-type", b"application/json")]


def make_app(dim: int):
    """The ASGI app: ``/health`` and ``/ready`` answer ``{}``; any POST answers its ``input`` (a string or
    a list) with ``dim``-dimensional base64 vectors; a body that is not such a request gets a 400."""
    import numpy as np
    import orjson

    vector = np.linspace(-1, 1, dim, dtype="<f4").tobytes()

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        status, body = 200, b"{}"
        if scope["method"] == "POST":
            chunks, more = [], True
            while more:
                message = await receive()
                chunks.append(message.get("body", b""))
                more = message.get("more_body", False)
            try:
                request = orjson.loads(b"".join(chunks))
                inputs = request["input"]
                inputs = [inputs] if isinstance(inputs, str) else list(inputs)
            except (orjson.JSONDecodeError, KeyError, TypeError):
                status, body = 400, b'{"error": {"message": "not an embeddings request"}}'
            else:
                data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(vector).decode()}
                        for i in range(len(inputs))]
                body = orjson.dumps({"object": "list", "data": data, "model": request.get("model"),
                                     "usage": {"prompt_tokens": 0, "total_tokens": 0}})
        await send({"type": "http.response.start", "status": status,
                    "headers": [*JSON, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    return app


def from_env():
    """uvicorn's ``--factory`` entry: the dimension from ``BARE_ASGI_DIM``."""
    return make_app(int(os.environ["BARE_ASGI_DIM"]))


def start_bare(dim: int, port: int) -> subprocess.Popen:
    """The bare app on 127.0.0.1:``port`` under uvicorn with the options the Tessera benchmark server has."""
    cmd = [sys.executable, "-m", "uvicorn", "--factory", "benchmarks.bare_asgi:from_env", "--host", "127.0.0.1",
           "--port", str(port), "--no-access-log", "--log-level", "warning", "--loop", "uvloop", "--http",
           "httptools"]
    env = {**os.environ, "BARE_ASGI_DIM": str(dim)}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
