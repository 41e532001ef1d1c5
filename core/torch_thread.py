"""One OS thread for all of a process's torch work on the CPU.

torch's CPU kernels run on OpenMP (GNU libgomp in the PyPI wheels), which keeps a team of threads per OS
thread that starts parallel work and stops letting idle team threads spin once a process holds more of them
than it has CPUs: a model loaded on one thread and run on another then pays a futex wake-up on every
parallel operator (the measurements are in docs/bench/history.md, "One thread for torch").

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
