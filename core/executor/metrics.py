"""``/metrics`` of a server with several processes (``frontends`` > 1): the front end that is scraped gathers
the exposition of every front end and every executor and answers one, in which each family appears once and
every sample carries a ``process`` label (``frontend-0``, ``frontend-1``, ``executor-cpu:0`` …).

Each front end listens on ``frontend-<index>.sock`` in the server's private run directory (the executors'
``address``): a connection gets that front end's exposition, then EOF. An executor answers a ``metrics``
frame on its own socket (``core.executor.server``). A process that does not answer within
``PEER_TIMEOUT_S`` (restarting, stuck) is left out with a warning and counted in
``tessera_metrics_missing_processes``; the scrape itself always answers.

The single-process server does not use this module: its ``/metrics`` is its own registry, unchanged."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Callable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from core.executor import wire

log = logging.getLogger(__name__)

#: seconds a scrape waits for another process's exposition
PEER_TIMEOUT_S = 2.0
MISSING = "tessera_metrics_missing_processes"


def frontend_socket(run_dir: str | Path, index: int) -> Path:
    return Path(run_dir) / f"frontend-{index}.sock"


async def serve_exposition(path: Path, render: Callable[[], bytes]) -> asyncio.AbstractServer:
    """Answer each connection on the Unix socket ``path`` with ``render()``, then close it."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(render())
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    path.unlink(missing_ok=True)  # left by a front end with this index that was killed
    return await asyncio.start_unix_server(answer, path=str(path))


class _Merged:
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self):
        return self.families


def merge(expositions: dict[str, str], missing: int) -> bytes:
    """One exposition of ``expositions`` (process name → its text): each family once (its first process's
    help and type), every sample labelled ``process``; plus ``tessera_metrics_missing_processes``."""
    families: dict[str, Metric] = {}
    for process, text in expositions.items():
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            merged.samples.extend(s._replace(labels={**s.labels, "process": process}) for s in family.samples)
    gauge = Metric(MISSING, "processes of the server whose metrics this scrape could not gather", "gauge")
    gauge.add_sample(MISSING, {}, float(missing))
    families[MISSING] = gauge
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(list(families.values())))
    return generate_latest(registry)


class Peers:
    """What a front end gathers from: the other front ends' sockets and the executors' (``executors``:
    device → socket), all in ``run_dir``; ``index``/``count``: this front end's number and how many there are."""

    def __init__(self, run_dir: str, index: int, count: int, executors: dict[str, str],
                 timeout: float = PEER_TIMEOUT_S):
        self.run_dir = run_dir
        self.index = index
        self.count = count
        self.executors = executors
        self.timeout = timeout

    @property
    def name(self) -> str:
        return f"frontend-{self.index}"

    async def gather(self, own: bytes) -> bytes:
        others = {f"frontend-{i}": self._frontend(i) for i in range(self.count) if i != self.index}
        others.update({f"executor-{device}": self._executor(path) for device, path in self.executors.items()})
        answers = await asyncio.gather(*(self._bounded(name, work) for name, work in others.items()))
        texts = {self.name: own.decode()}
        missing = 0
        for name, text in zip(others, answers):
            if text is None:
                missing += 1
            else:
                texts[name] = text
        return merge(texts, missing)

    async def _bounded(self, name: str, work) -> str | None:
        try:
            return (await asyncio.wait_for(work, self.timeout)).decode()
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, KeyError) as exc:
            log.warning("metrics: %s did not answer (%s); left out of this scrape", name,
                        type(exc).__name__ if not str(exc) else exc)
            return None

    async def _frontend(self, index: int) -> bytes:
        reader, writer = await asyncio.open_unix_connection(str(frontend_socket(self.run_dir, index)))
        try:
            return await reader.read()
        finally:
            writer.close()

    async def _executor(self, path: str) -> bytes:
        reader, writer = await asyncio.open_unix_connection(path)
        try:
            wire.write_frame(writer, {"op": "metrics"})
            await writer.drain()
            header, payload = await wire.read_frame(reader)
            if header.get("op") != "metrics":
                raise ValueError(f"unexpected answer {header.get('op')!r}")
            return payload or b""
        finally:
            writer.close()
