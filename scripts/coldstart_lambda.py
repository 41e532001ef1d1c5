#!/usr/bin/env python
"""Cold start of the Lambda handler, measured in fresh processes.

    .venv/bin/python scripts/coldstart_lambda.py [--runs 3] [--memory 1769] [--client ric|import]
                                                 [--inputs N --words W]
                                                 [--package TREE --python PY312 --runtime-client DIR]

``--client ric`` (the default) runs the handler the way the Lambda Python base image does:
``python -m awslambdaric handler.handler`` (AWS's runtime interface client, from the dev extra) in a
new process, against a Runtime API stand-in on 127.0.0.1 (benchmarks/lambda_runtime.py) that hands
it one function-URL embedding event. Measured per run: from the process's start (Python's own start-up
included) to the end of init (the handler's "init done" log line) and to the first answer posted to
the Runtime API; the process's peak RSS (VmHWM in /proc) and whether any torch library is mapped.
The first request itself is timed too (``ric``: from the event's hand-out to its answer at the Runtime
API; ``import``: the handler call, and a second call of the same event after it, for comparison; in
process, since between two invocations the stand-in's HTTP exchange with the client adds a delay of its
own). ``--inputs N --words W`` makes the event N texts of about W words (the batch shape of that first
request), to weigh a warm-up (``TESSERA_LAMBDA_WARM_UP=true``, passed on like every ``TESSERA_`` variable)
against what its absence costs the first request of a shape.
``--client import`` imports the handler in-process and calls it (no runtime client; init is timed
from the start of the import).

``--package TREE`` runs a built zip package (``scripts/build_lambda_zip.py --tree TREE``) as the managed
runtime would: TREE as the task root, ``--python`` (a Python 3.12) with ``--runtime-client DIR`` (awslambdaric
installed for that Python, e.g. by ``pip install --target DIR --python-version 3.12 --only-binary=:all:
awslambdaric``) on its path, the packed model as ``TESSERA_MODELS``, and no bytecode written (Lambda's
task root is read-only).

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
SENTENCE = "How long does a cold start take?"
EVENT = {
    "version": "2.0", "routeKey": "$default", "rawPath": "/v1/embeddings", "rawQueryString": "",
    "headers": {"content-type": "application/json", "host": "example.lambda-url.us-east-1.on.aws"},
    "requestContext": {"http": {"method": "POST", "path": "/v1/embeddings", "protocol": "HTTP/1.1",
                                "sourceIp": "203.0.113.1", "userAgent": "coldstart"},
                       "routeKey": "$default", "stage": "$default", "requestId": "coldstart"},
    "body": json.dumps({"input": [SENTENCE]}), "isBase64Encoded": False,
}


def event_for(inputs: int, words: int | None) -> dict:
    """The function-URL embedding event with ``inputs`` texts of about ``words`` words each (None: the sentence)."""
    if inputs == 1 and words is None:
        return EVENT
    texts = [" ".join([f"text {i}:"] + [SENTENCE.split()[j % 7] for j in range(words or 7)]) for i in range(inputs)]
    return {**EVENT, "body": json.dumps({"input": texts})}

CHILD = r"""
import importlib.util, json, resource, sys, time
started = time.perf_counter()
spec = importlib.util.spec_from_file_location("handler", sys.argv[1])
handler = importlib.util.module_from_spec(spec)
spec.loader.exec_module(handler)
init_done = time.perf_counter()
event = json.loads(sys.argv[3])
response = handler.handler(event, None)
first = time.perf_counter()
assert response["statusCode"] == 200, response
handler.handler(event, None)
second = time.perf_counter()
print(json.dumps({"init_s": init_done - started, "first_response_s": first - started,
                  "first_request_ms": round((first - init_done) * 1000, 1),
                  "second_request_ms": round((second - first) * 1000, 1),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "torch_loaded": "torch" in sys.modules, "threads": handler.settings.threads}))
"""


def run_import(memory: int, event: dict) -> dict:
    env = {**os.environ, "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(HANDLER), str(ROOT), json.dumps(event)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"cold start run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_ric(memory: int, event: dict, package: argparse.Namespace | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k.startswith("TESSERA_")}
    env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] = str(memory)
    process: dict = {}
    if package is not None:
        from build_lambda_zip import models_env

        env.setdefault("TESSERA_MODELS", models_env(str(package.package)))
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        process = {"python": package.python, "pythonpath": package.runtime_client}
    with RuntimeAPI() as api:
        pending = api.submit(event)
        started = time.monotonic()
        task_root = package.package if package is not None else HANDLER.parent
        with RuntimeProcess(api, task_root, ROOT, env, **process) as proc:
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
    return {"first_response_s": first, "first_request_ms": outcome.posted_ms - outcome.handed_out_ms,
            "init_s": float(init_line.group(1)) if init_line else float("nan"),
            "peak_rss_mb": float("nan") if rss is None else rss, "torch_loaded": any("torch" in f.lower() for f in files),
            "threads": int(init_line.group(2)) if init_line else 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--memory", type=int, default=1769, help="AWS_LAMBDA_FUNCTION_MEMORY_SIZE (MB)")
    parser.add_argument("--client", choices=["ric", "import"], default="ric",
                        help="ric: python -m awslambdaric against a Runtime API stand-in; import: in-process")
    parser.add_argument("--inputs", type=int, default=1, help="texts in the event (default: one sentence)")
    parser.add_argument("--words", type=int, default=None, help="words per text (default: the sentence's 7)")
    parser.add_argument("--package", type=Path, help="a built zip package's tree, run as the managed runtime would")
    parser.add_argument("--python", help="with --package: a Python 3.12")
    parser.add_argument("--runtime-client", type=Path, help="with --package: awslambdaric installed for --python")
    args = parser.parse_args(argv)
    event = event_for(args.inputs, args.words)
    if args.package is not None:
        if args.client != "ric" or not (args.python and args.runtime_client):
            parser.error("--package runs under the runtime client and needs --python and --runtime-client")
        runs = [run_ric(args.memory, event, args) for _ in range(args.runs)]
    else:
        run = run_ric if args.client == "ric" else run_import
        runs = [run(args.memory, event) for _ in range(args.runs)]
    origin = "process start" if args.client == "ric" else "handler import"
    for i, r in enumerate(runs, 1):
        print(f"run {i}: first response {r['first_response_s'] * 1000:.0f} ms after {origin} "
              f"(handler init {r['init_s'] * 1000:.0f} ms), peak RSS {r['peak_rss_mb']:.0f} MB, "
              f"threads {r['threads']}, torch loaded: {r['torch_loaded']}"
              + f"; first request {r['first_request_ms']} ms"
              + (f", second {r['second_request_ms']} ms" if "second_request_ms" in r else ""))
    print(f"median ({args.client}): first response {statistics.median(r['first_response_s'] for r in runs) * 1000:.0f} ms, "
          f"peak RSS {statistics.median(r['peak_rss_mb'] for r in runs):.0f} MB"
          + f"; first request {statistics.median(r['first_request_ms'] for r in runs):.0f} ms"
          + (f", second {statistics.median(r['second_request_ms'] for r in runs):.0f} ms" if args.client == "import" else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
