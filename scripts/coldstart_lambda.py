#!/usr/bin/env python
"""Cold start of the Lambda handler, measured in fresh processes.

    .venv/bin/python scripts/coldstart_lambda.py [--runs 3] [--memory 1769] [--client ric|import]

``--client ric`` (the default) runs the handler the way the Lambda Python base image does:
``python -m awslambdaric handler.handler`` (AWS's runtime interface client, from the dev extra) in a
new process, against a Runtime API stand-in on 127.0.0.1 (benchmarks/lambda_runtime.py) that hands
it one function-URL embedding event. Measured per run: from the process's start (Python's own start-up
included) to the end of init (the handler's "init done" log line) and to the first answer posted to
the Runtime API; the process's peak RSS (VmHWM in /proc) and whether any torch library is mapped.
``--client import`` imports the handler in-process and calls it (no runtime client; init is timed
from the start of the import).

Not included either way: Lambda's sandbox start and the image pull. Configure models with TESSERA_*
as for the handler.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.lambda_runtime import RuntimeAPI, RuntimeProcess, mapped_files
from benchmarks.server import peak_rss_mb

ROOT = Path(__file__).resolve().parents[1]
HANDLER = ROOT / "adapters" / "lambda" / "handler.py"
EVENT = {
    "version": "2.0", "routeKey": "$default", "rawPath": "/v1/embeddings", "rawQueryString": "",
    "headers": {"content-type": "application/json", "host": "example.lambda-url.us-east-1.on.aws"},
    "requestContext": {"http": {"method": "POST", "path": "/v1/embeddings", "protocol": "HTTP/1.1",
                                "sourceIp": "203.0.113.1", "userAgent": "coldstart"},
                       "routeKey": "$default", "stage": "$default", "requestId": "coldstart"},
    "body": json.dumps({"input": ["How long does a cold start take?"]}), "isBase64Encoded": False,
}

CHILD = r"""
import importlib.util, json, resource, sys, time
started = time.perf_counter()
spec = importlib.util.spec_from_file_location("handler", sys.argv[1])
handler = importlib.util.module_from_spec(spec)
spec.loader.exec_module(handler)
init_done = time.perf_counter()
response = handler.handler(json.loads(sys.argv[3]), None)
first = time.perf_counter()
assert response["statusCode"] == 200, response
print(json.dumps({"init_s": init_done - started, "first_response_s": first - started,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "torch_loaded": "torch" in sys.modules, "threads": handler.settings.threads}))
"""


def run_import(memory: int) -> dict:
    env = {**os.environ, "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(HANDLER), str(ROOT), json.dumps(EVENT)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"cold start run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_ric(memory: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k.startswith("TESSERA_")}
    env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] = str(memory)
    with RuntimeAPI() as api:
        pending = api.submit(EVENT)
        started = time.monotonic()
        with RuntimeProcess(api, HANDLER.parent, ROOT, env) as proc:
            try:
                outcome = api.wait(pending, 300)
            except TimeoutError:
                raise SystemExit(f"no answer from the runtime client:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
            first = time.monotonic() - started
            if outcome.kind != "response" or outcome.body.get("statusCode") != 200:
                raise SystemExit(f"cold start run failed: {outcome.body}\n{proc.stdout[-3000:]}")
            files = mapped_files(proc.proc.pid)
            rss = peak_rss_mb(proc.proc.pid)
            init_line = re.search(r"init done in ([\d.]+)s: .*?, (\d+) threads", proc.stdout)
    # the handler's own init time, from the import of its module; plus what came before it (interpreter
    # start, the client's import) ≈ first answer - init - the request
    return {"first_response_s": first, "init_s": float(init_line.group(1)) if init_line else float("nan"),
            "peak_rss_mb": float("nan") if rss is None else rss, "torch_loaded": any("torch" in f.lower() for f in files),
            "threads": int(init_line.group(2)) if init_line else 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--memory", type=int, default=1769, help="AWS_LAMBDA_FUNCTION_MEMORY_SIZE (MB)")
    parser.add_argument("--client", choices=["ric", "import"], default="ric",
                        help="ric: python -m awslambdaric against a Runtime API stand-in; import: in-process")
    args = parser.parse_args(argv)
    run = run_ric if args.client == "ric" else run_import
    runs = [run(args.memory) for _ in range(args.runs)]
    origin = "process start" if args.client == "ric" else "handler import"
    for i, r in enumerate(runs, 1):
        print(f"run {i}: first response {r['first_response_s'] * 1000:.0f} ms after {origin} "
              f"(handler init {r['init_s'] * 1000:.0f} ms), peak RSS {r['peak_rss_mb']:.0f} MB, "
              f"threads {r['threads']}, torch loaded: {r['torch_loaded']}")
    print(f"median ({args.client}): first response {statistics.median(r['first_response_s'] for r in runs) * 1000:.0f} ms, "
          f"peak RSS {statistics.median(r['peak_rss_mb'] for r in runs):.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
