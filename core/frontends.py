"""How many HTTP front-end processes a server runs (setting ``frontends``), and why.

``frontends: auto`` is sized from the cores this process may run on (``os.sched_getaffinity``) and the devices
of the models:

- **CPU only**: one front end, today's single process. The models' own threads (ONNX Runtime's intra-op
  pool, torch's) already use every core. Measured on a 2-core machine with the near-free model
  (docs/benchmarks.md, "Front ends on a CPU";
  ``python scripts/bench_host_cpu.py --servers tessera --models near-free --frontends 1,2``): two front ends
  gave 0.78–1.03× the embeddings/s of one process and 1.27–1.37× its CPU per one-text request.
- **Accelerators** (``cuda``, ``neuron``): each accelerator device gets an executor process that keeps about
  one core busy; the cores left over tokenize and encode, one front end per 2 of them, at most
  :data:`MAX_AUTO`.

- **A model on several devices** (``cuda:0,cuda:1``, ``cuda:*``, ``cpu:0,cpu:1``): its executors need front ends,
  so at least 2, else the rule above.

A number (``frontends: 3``) is used as given. ``1`` always means one process: no supervisor, no executor.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Iterable

from core.devices import is_accelerator, is_device_list

#: at most this many front ends from ``auto`` (beyond it the executors' queues, not the hosts, limit)
MAX_AUTO = 8
#: front ends under ``auto`` when a model's device is served by executors (several devices, or one ``cpu:N``;
#: one front end would be the supervised layout's least)
MIN_WITH_EXECUTORS = 2
#: cores per front end under ``auto`` (one for the event loop, one for its tokenizer threads)
CORES_PER_FRONTEND = 2
#: where the CPU rule's measurement is described
CPU_RULE_DOCS = "docs/benchmarks.md#front-ends-on-a-cpu"


@dataclass(frozen=True)
class FrontendPlan:
    """``count`` front-end processes, and ``reason``: one sentence, logged at start-up and shown in
    ``/v1/models`` (``"frontends": {"count": N, "reason": "..."}``)."""

    count: int
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


#: what a surface that always runs one process says (``uvicorn core.dev:app``, Lambda, an app built in-process)
ONE_PROCESS = FrontendPlan(1, "this entry point serves from one process (uvicorn core.dev:app, Lambda, in-process); "
                              "`python -m core serve` and SageMaker's `serve` start front ends")


def device_names(devices: Iterable[str]) -> list[str]:
    """The distinct devices of the models' ``device`` fields, in order (``cuda:0,cuda:1`` names two)."""
    seen: dict[str, None] = {}
    for device in devices:
        for part in str(device).split(","):
            part = part.strip()
            if part:
                seen.setdefault(part, None)
    return list(seen)


def plan_frontends(setting: int | str, devices: Iterable[str], cpus: int | None = None) -> FrontendPlan:
    """The front ends for the setting ``frontends`` (a number or ``auto``), the models' devices and ``cpus``
    usable cores (default: this process's affinity)."""
    if setting != "auto":
        count = int(setting)
        what = "one process" if count == 1 else f"{count} front-end processes"
        return FrontendPlan(count, f"frontends={count} was set: {what}")
    cpus = cpus if cpus is not None else len(os.sched_getaffinity(0))
    devices = [str(d) for d in devices]
    names = device_names(devices)
    accelerators = [d for d in names if is_accelerator(d)]
    listed = [d for d in devices if is_device_list(d)]
    # a model on several devices (or on one cpu:N) runs in executors, which only a server with front ends has
    if listed:
        count = max(MIN_WITH_EXECUTORS, min(MAX_AUTO, max(0, cpus - len(names)) // CORES_PER_FRONTEND))
        return FrontendPlan(count, f"auto: a model's device ({listed[0]}) is served by executor processes, one per "
                                   f"device, which need front ends; {count} for {cpus} cores (one per "
                                   f"{CORES_PER_FRONTEND} cores beside the executors, at least {MIN_WITH_EXECUTORS}, "
                                   f"at most {MAX_AUTO})")
    if not accelerators:
        return FrontendPlan(1, f"auto: CPU only, so one process: the models' own threads use all {cpus} cores, "
                               f"and a second front end measured no faster, a one-text request dearer "
                               f"({CPU_RULE_DOCS})")
    spare = max(0, cpus - len(accelerators))
    count = max(1, min(MAX_AUTO, spare // CORES_PER_FRONTEND))
    return FrontendPlan(count, f"auto: {len(accelerators)} accelerator(s) ({', '.join(accelerators)}) on {cpus} "
                               f"cores: {spare} cores beside their executors, one front end per "
                               f"{CORES_PER_FRONTEND}, at most {MAX_AUTO}")


def plan_for(settings) -> FrontendPlan:
    """:func:`plan_frontends` for ``settings`` (its ``frontends`` and its models' devices)."""
    return plan_frontends(settings.frontends, (spec.device for spec in settings.model_specs()))
