"""One OS thread for all of a process's torch work on the CPU.

torch's CPU kernels run on OpenMP (GNU libgomp in the PyPI wheels). libgomp keeps a team of threads per OS
thread that starts parallel work, and once a process holds more of its threads than it has CPUs it stops
letting idle team threads spin: every parallel operator then pays a futex wake-up. A server that loads a
model on one thread and runs it on another is in that state from its first request. Measured on 2 CPUs
(ViT-B/32-sized CLIP, one short text, int8; docs/benchmarks.md, "One thread for torch"): 4.2-4.9 ms a
forward when one thread loads and runs the model, 8.9-12.5 ms when the model was loaded, or any torch
operator ran, on another thread first; small operators (mul, layer_norm, sigmoid) took 7-12x longer each.

So the torch backend loads, warms up and runs CPU models here, and the ONNX exporter traces here, whatever
thread asks: the process keeps one OpenMP team. The thread starts on first use (not at import) and again
in a forked child.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_owner_pid = 0
_ident: int | None = None


def _enter() -> None:
    global _ident
    _ident = threading.get_ident()


def _torch_executor() -> ThreadPoolExecutor:
    global _executor, _owner_pid
    with _lock:
        if _executor is None or _owner_pid != os.getpid():  # a forked child has the object, not the thread
            _executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-cpu", initializer=_enter)
            _owner_pid = os.getpid()
        return _executor


def on_torch_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """``fn(*args, **kwargs)`` on the process's torch thread (directly when called from it), blocking the
    caller until it returns; its exception is raised here."""
    if is_torch_thread():
        return fn(*args, **kwargs)
    return _torch_executor().submit(fn, *args, **kwargs).result()


def is_torch_thread() -> bool:
    return threading.get_ident() == _ident and _owner_pid == os.getpid()
