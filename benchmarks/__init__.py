"""Benchmark and measurement code for a checkout of Tessera; ``scripts/bench*.py``, ``compare_infinity.py``,
``profile_server.py``, ``soak.py`` and ``coldstart_lambda.py`` are thin command lines over it, and the tests
reuse its sample data and its stand-ins.

Modules (each small, each one job):

- ``texts``: the deterministic benchmark texts (short / long / mixed) and the varied sample sentences
- ``media``: sample images and sounds, and a loopback HTTP server that serves them
- ``loopback``: the thread-served HTTP server on 127.0.0.1 under every loopback stand-in
- ``lambda_runtime``: a Lambda Runtime API stand-in and AWS's runtime client run against it (cold start)
- ``artifacts``: model folders prepared once under ``.venv/models/`` (ONNX export, CTranslate2), token counts
- ``server``: start a Tessera server on loopback, the one ready-check, the process's CPU and memory
- ``load``: the closed-loop HTTP load generator (every response verified), also split over processes
- ``results``: a cell's figures as one JSON row, and the Markdown tables
- ``inprocess``: the same model called in-process (engine, bare runtime call)
- ``plain_ort``: the plain ONNX Runtime loop a user writes by hand (the runtime's own limit), per text task;
  ``plain_torch``: the same for CLIP on torch
- ``task_models``: random-weight model folders of real sizes (MiniLM-L6 cross-encoder and classifier,
  ViT-B/32 CLIP); ``task_compare``: the rerank / classify / CLIP comparison with Infinity
- ``parity``: cosine checks against a reference (a server's answers, an in-process engine)
- ``budget``, ``machine``, ``docs_section``, ``gpu``, ``gpu_report``: the GPU run's time budget, machine
  probe, ``docs/benchmarks.md`` section update, per-backend run and its Markdown report
- ``infinity``, ``charts``: the Infinity comparison's reference server and its charts
- ``host_cpu``: the CPU a server's whole process tree spends per embedding, on a near-free model and the
  default one, Tessera and Infinity interleaved (``scripts/bench_host_cpu.py``); ``bare_asgi``: the floor
  beside them, a bare ASGI app answering the same requests without a model
- ``pyspy``: the summary of a py-spy profile of a server

Nothing here runs at import time; heavy libraries (aiohttp, numpy, onnxruntime, torch) load inside the
functions that need them.
"""

from pathlib import Path

#: the checkout this package lives in (servers start here; prepared models go to .venv/models/)
ROOT = Path(__file__).resolve().parents[1]
