#!/usr/bin/env python3
"""What one Lambda invocation costs in this process beyond the app: ``handler.handler(event, context)`` plus
what awslambdaric's runtime client then does with its answer (``LambdaMarshaller.marshal_response``, the
JSON it posts to the Runtime API), for an embeddings request of ``--inputs`` texts, as float lists
(the large answer) and as base64.

The embedding cache is on and warm, so the model's work is taken out and what is left is the event
handling: Mangum, the app, the early size check, the measuring and writing of the answer.

    PYTHONPATH=. .venv/bin/python scripts/bench_lambda_handler.py [--inputs 256] [--repeat 30]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(args: argparse.Namespace) -> None:
    import importlib.util

    import orjson
    from awslambdaric.lambda_runtime_marshaller import LambdaMarshaller

    sys.path.insert(0, str(ROOT))
    from tests.adapters.events import LambdaContext, function_url_event

    os.environ.update({"TESSERA_EMBEDDING_CACHE": "memory", "TESSERA_LOG_LEVEL": "warning",
                       "TESSERA_ACCESS_LOG": "false", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1769"})
    spec = importlib.util.spec_from_file_location("handler", ROOT / "adapters" / "lambda" / "handler.py")
    handler = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(handler)
    marshaller = LambdaMarshaller()
    texts = [f"sentence number {i} about the cost of an invocation" for i in range(args.inputs)]
    print(f"{args.inputs} inputs per request, embedding cache warm (model work out), {args.repeat} invocations "
          "each, ms per invocation (handler + the runtime client's encoding of its answer; CPU: this process's CPU time, "
          "steadier than wall time on a busy machine):")
    for encoding in ("float", "base64"):
        event = function_url_event("POST", "/v1/embeddings",
                                   orjson.dumps({"input": texts, "encoding_format": encoding}))
        wall, cpu = [], []
        for i in range(args.repeat + 3):
            started, started_cpu = time.perf_counter(), time.process_time()
            response = handler.handler(event, LambdaContext())
            posted, _ = marshaller.marshal_response(response)
            if i >= 3:  # the first ones fill the cache
                wall.append((time.perf_counter() - started) * 1000)
                cpu.append((time.process_time() - started_cpu) * 1000)
            assert response["statusCode"] == 200, str(response)[:300]
        print(f"  {encoding:7s} answer {len(posted) / 1e6:5.2f} MB  wall median {statistics.median(wall):7.2f} "
              f"min {min(wall):7.2f}  CPU median {statistics.median(cpu):7.2f}")
    handler.loop.run_until_complete(handler.registry.stop(drain=False))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=30)
    main(parser.parse_args())
