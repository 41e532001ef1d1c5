#!/usr/bin/env python
"""Host CPU per embedding: what the server's whole process tree spends per embedding, its throughput and
the cores it keeps busy, for a near-free model (1 layer, hidden 32, all-MiniLM-L6-v2's tokenizer: all that
is left is the serving layer) and the default model (all-MiniLM-L6-v2, ONNX Runtime fp32); Tessera and
Infinity on the same model folder, and a bare ASGI app that answers the same requests without a model (the
stack's floor), interleaved in one run (round 1: Tessera, Infinity, bare; round 2: …), on 127.0.0.1, short
texts (``--texts long`` or ``mixed`` for others), closed-loop clients.

    # the full run (Infinity in its own environment, see below); a few minutes
    python scripts/bench_host_cpu.py --rounds 3 --duration 5 --json /tmp/host-cpu.json

    # this checkout against the commit before it, interleaved (Infinity left out)
    git worktree add /tmp/before HEAD~1
    python scripts/bench_host_cpu.py --servers tessera --baseline /tmp/before --models near-free

    # seconds: one round, short cells
    python scripts/bench_host_cpu.py --quick --servers tessera --models near-free

    # one process against two front ends (python -m core serve --frontends 1 / 2), interleaved
    python scripts/bench_host_cpu.py --servers tessera --models near-free --frontends 1,2

Figures per cell: µs of server CPU per embedding and per request (user + system time of the server process
and all its descendants, children that exited included, read from /proc at the start and end of the
measured window ÷ what was answered in it), embeddings/s, cores busy (CPU seconds ÷ wall seconds), and for
Tessera the items a batch it formed (its /metrics read before and after the cell: two rounds of one shape that
differ in CPU but not in their batches differ in the machine, not in the batching). The load generator (aiohttp) runs in processes of its own, outside the server's tree: its CPU is not counted,
it is shown beside. Then the medians over the rounds, Tessera ÷ each other server per round, and the
floors: tokenizer µs per text and base64 + JSON µs per embedding on the same texts, measured in-process
with the servers stopped. The machine's load average is printed with every cell: on a shared machine read the
CPU per embedding (it moves less with load) before the throughput.

Infinity (infinity-emb 0.0.78, optimum engine) runs from its own environment, as
scripts/compare_infinity.sh sets it up:

    python3.11 -m venv .venv/infinity
    .venv/infinity/bin/python -m pip install torch==2.13.0 "infinity-emb[server,optimum]==0.0.78"

The parts live in benchmarks/host_cpu.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from benchmarks import ROOT
from benchmarks.host_cpu import MODELS, SERVERS, known_server, markdown, run

INFINITY_SETUP = ("python3.11 -m venv .venv/infinity && .venv/infinity/bin/python -m pip install "
                  "torch==2.13.0 'infinity-emb[server,optimum]==0.0.78'   (or: scripts/compare_infinity.sh)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--servers", default="tessera,infinity,bare",
                   help="comma-separated, of tessera (this checkout), infinity, bare (a bare ASGI app answering "
                        "the same requests without a model: the floor), baseline (--baseline's checkout)")
    p.add_argument("--baseline", type=Path,
                   help="another checkout of Tessera (e.g. `git worktree add /tmp/before HEAD~1`): served as "
                        "'baseline' with this environment, interleaved with the others (adds it to --servers)")
    p.add_argument("--batch", default="32,1", help="texts per request, comma-separated")
    p.add_argument("--texts", default="short", choices=("short", "long", "mixed"),
                   help="the texts sent (benchmarks/texts.py): short ≈ 13 tokens, long ≈ 130, mixed 4–250")
    p.add_argument("--concurrency", type=int, default=64, help="closed-loop clients")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per cell")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--client-processes", type=int, default=1,
                   help="processes the load generator's clients are split over (never the server's)")
    p.add_argument("--floor-seconds", type=float, default=1.0, help="seconds per floor figure")
    p.add_argument("--quick", action="store_true", help="one round of 1.5 s cells, 0.3 s floors (seconds in all)")
    p.add_argument("--infinity", default=str(ROOT / ".venv" / "infinity" / "bin" / "infinity_emb"),
                   help="the infinity_emb executable (default: .venv/infinity/bin/infinity_emb)")
    p.add_argument("--tessera-env", action="append", default=[], metavar="KEY=VALUE",
                   help="a setting for Tessera's server, e.g. TESSERA_ACCESS_LOG=false (repeatable; default: "
                        "its defaults, the access log on, its lines to a file)")
    p.add_argument("--tessera-option", action="append", default=[], metavar="KEY=JSON",
                   help="a model-spec option for Tessera, e.g. ort_spin=false or workers=1 (repeatable)")
    p.add_argument("--baseline-option", action="append", default=None, metavar="KEY=JSON",
                   help="a model-spec option for the baseline instead of --tessera-option's (repeatable): with "
                        "--baseline . an A/B of a setting, e.g. --tessera-option ort_spin='\"run\"' "
                        "--baseline-option ort_spin=true")
    p.add_argument("--frontends", default=None, metavar="N[,M...]",
                   help="serve this checkout as `python -m core serve --frontends N` (the supervisor, the executor "
                        "and N front ends: the whole tree counted), once per value, as servers tessera-fN in place "
                        "of tessera (e.g. 1,2: one process against two front ends, interleaved)")
    p.add_argument("--json", type=Path, help="also write every cell, the medians and the floors here")
    args = p.parse_args(argv)
    if args.quick:
        args.rounds, args.duration, args.floor_seconds = 1, 1.5, 0.3

    models = args.models.split(",")
    servers = args.servers.split(",")
    if unknown := [m for m in models if m not in MODELS]:
        p.error(f"unknown model(s) {', '.join(unknown)}: use {', '.join(MODELS)}")
    if args.baseline is not None:
        if not (args.baseline / "core" / "dev.py").is_file():
            p.error(f"--baseline {args.baseline}: not a checkout of Tessera (no core/dev.py)")
        args.baseline = args.baseline.resolve()
        servers += [] if "baseline" in servers else ["baseline"]
    if args.frontends:
        try:
            counts = [int(n) for n in args.frontends.split(",")]
        except ValueError:
            p.error(f"--frontends {args.frontends}: expected numbers, e.g. 1,2")
        if any(n < 1 for n in counts):
            p.error("--frontends: at least 1 front end")
        named = [f"tessera-f{n}" for n in counts]
        servers = named + [s for s in servers if s != "tessera" and s not in named]
    if unknown := [s for s in servers if not known_server(s)]:
        p.error(f"unknown server(s) {', '.join(unknown)}: use {', '.join(SERVERS)}")
    if "baseline" in servers and args.baseline is None:
        p.error("the baseline server needs --baseline DIR")
    infinity = str(Path(args.infinity).resolve())
    if "infinity" in servers and not Path(infinity).exists():
        p.error(f"no Infinity at {args.infinity}; create its environment with\n    {INFINITY_SETUP}\n"
                "or leave it out with --servers tessera,bare")
    batches = [int(b) for b in args.batch.split(",")]
    tessera_env = dict(kv.split("=", 1) for kv in args.tessera_env)
    tessera_options = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.tessera_option)}
    baseline_options = (None if args.baseline_option is None
                        else {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.baseline_option)})

    load = os.getloadavg()
    print(f"host CPU per embedding: {', '.join(models)} × {', '.join(servers)}, {args.concurrency} clients, "
          f"{args.texts} texts, {'/'.join(map(str, batches))} texts per request, {args.rounds} round(s) of "
          f"{args.duration:g} s cells; {len(os.sched_getaffinity(0))} CPUs, load average {load[0]:.1f} "
          f"{load[1]:.1f} {load[2]:.1f}" + (f"; Tessera with {tessera_env}" if tessera_env else "")
          + (f"; Tessera's model options {tessera_options}" if tessera_options else "")
          + (f"; the baseline's {baseline_options}" if baseline_options is not None else ""), flush=True)
    print("server CPU = user + system time of the server's whole process tree (children that exited included), "
          "from /proc; the load generator runs in its own process and is NOT counted (shown beside), nor is what "
          "the idle server(s) spend meanwhile (shown beside)\n", flush=True)
    result = run(models, servers, batches, args.concurrency, args.duration, args.rounds, infinity,
                 args.client_processes, args.floor_seconds, tessera_env, tessera_options,
                 baseline=args.baseline, log=lambda line: print(line, flush=True), baseline_options=baseline_options,
                 kind=args.texts)
    after = result["loadavg_after"]
    print(f"\n### Medians over {args.rounds} round(s) (load average before {load[0]:.1f}, after {after[0]:.1f})\n")
    print(markdown(result))
    for name, s in result["servers"].items():
        print(f"- {name}: start → ready {s['start_s']:.1f} s, peak RSS {s.get('peak_rss_mb') or 0:.0f} MB")
    print(f"- the Tessera servers' logs: {result['log_dir']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 1 if any(c["errors"] for c in result["cells"]) else 0


if __name__ == "__main__":
    sys.exit(main())
