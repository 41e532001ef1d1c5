"""A global time budget for a benchmark run: a deadline, a reserve for writing the results, and the elapsed
time of each phase."""

from __future__ import annotations

import contextlib
import time

#: seconds kept back at the end for tearing down and writing the results
RESERVE_S = 15.0


class Budget:
    """A global deadline (seconds after start) and the elapsed time of each phase."""

    def __init__(self, deadline_s: float, reserve_s: float = RESERVE_S):
        self.t0 = time.perf_counter()
        self.deadline_s = deadline_s
        self.reserve_s = reserve_s
        self.phases: list[dict] = []
        self.hit = False

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return max(1.0, self.deadline_s - self.reserve_s - self.elapsed())

    def allows(self, seconds: float) -> bool:
        """Whether ``seconds`` more still fit; a refusal is remembered in ``hit``."""
        ok = self.elapsed() + seconds + self.reserve_s <= self.deadline_s
        self.hit = self.hit or not ok
        return ok

    @contextlib.contextmanager
    def phase(self, name: str):
        start = time.perf_counter()
        print(f"[{self.elapsed():6.1f} s] {name} ...", flush=True)
        try:
            yield
        finally:
            took = time.perf_counter() - start
            self.phases.append({"phase": name, "seconds": round(took, 2)})
            print(f"[{self.elapsed():6.1f} s] {name}: {took:.1f} s", flush=True)
