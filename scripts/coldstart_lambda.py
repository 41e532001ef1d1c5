#!/usr/bin/env python
"""Cold start of the Lambda handler, measured in fresh processes.

    python scripts/coldstart_lambda.py [--runs 3] [--memory 1769] [--handler adapters/lambda/handler.py]

Each run starts a new Python process that imports the handler (which builds the registry at init, as
Lambda does) and sends one function-URL embedding event. Printed per run: the time from the start
of the handler's import to the end of init, to the first embedding response, and the process's peak
RSS (``resource.getrusage``). Python's own start-up (before the import) is not included; Lambda's
sandbox start and image pull are not either. Configure models with TESSERA_* as for the handler.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import importlib.util, json, resource, sys, time
started = time.perf_counter()
spec = importlib.util.spec_from_file_location("handler", sys.argv[1])
handler = importlib.util.module_from_spec(spec)
spec.loader.exec_module(handler)
init_done = time.perf_counter()
event = {
    "version": "2.0", "routeKey": "$default", "rawPath": "/v1/embeddings", "rawQueryString": "",
    "headers": {"content-type": "application/json", "host": "example.lambda-url.us-east-1.on.aws"},
    "requestContext": {"http": {"method": "POST", "path": "/v1/embeddings", "protocol": "HTTP/1.1",
                                "sourceIp": "203.0.113.1", "userAgent": "coldstart"},
                       "routeKey": "$default", "stage": "$default", "requestId": "coldstart"},
    "body": json.dumps({"input": ["How long does a cold start take?"]}), "isBase64Encoded": False,
}
response = handler.handler(event, None)
first = time.perf_counter()
assert response["statusCode"] == 200, response
print(json.dumps({"init_s": init_done - started, "first_response_s": first - started,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "torch_loaded": "torch" in sys.modules, "threads": handler.settings.threads}))
"""


def run_once(handler: Path, memory: int) -> dict:
    env = {**os.environ, "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(handler), str(ROOT)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"cold start run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--memory", type=int, default=1769, help="AWS_LAMBDA_FUNCTION_MEMORY_SIZE (MB)")
    parser.add_argument("--handler", type=Path, default=ROOT / "adapters" / "lambda" / "handler.py")
    args = parser.parse_args()
    runs = [run_once(args.handler, args.memory) for _ in range(args.runs)]
    for i, r in enumerate(runs, 1):
        print(f"run {i}: init {r['init_s'] * 1000:.0f} ms, first response {r['first_response_s'] * 1000:.0f} ms, "
              f"peak RSS {r['peak_rss_mb']:.0f} MB, threads {r['threads']}, torch loaded: {r['torch_loaded']}")
    print(f"median: first response {statistics.median(r['first_response_s'] for r in runs) * 1000:.0f} ms, "
          f"peak RSS {statistics.median(r['peak_rss_mb'] for r in runs):.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
