"""``Batcher.should_share_threads``: what the batcher answers a backend that asks, as a batch starts, whether
to leave threads for other work (ONNX Runtime: a lane's share of its threads) or take every thread. Driven through
the batcher's own loop, workers and event loop, with a batch function that asks the question as a real backend
does, on the thread that runs the batch."""

from __future__ import annotations

import asyncio
import threading
import time

from core.batching import Batcher


class Asking:
    """A batch function that records, for each batch, its items, the thread it ran on and the batcher's answer,
    then waits for ``gate`` (work queues behind a batch that has not ended)."""

    def __init__(self):
        self.batcher: Batcher | None = None
        self.seen: list[tuple[list, str, bool]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, items):
        self.seen.append((list(items), threading.current_thread().name, self.batcher.should_share_threads()))
        self.gate.wait(5)
        return [("out", x) for x in items]


async def _until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.001)


def test_a_batch_shares_only_when_a_full_batch_is_left_behind_it():
    """Two workers, a budget of 20 tokens (two items of 10), batches of no known cost. A batch with nothing behind it
    takes every thread; one that leaves a full batch queued shares (the loop starts that batch beside it at once);
    one that leaves only a partial batch takes every thread, since that batch waits for it to end."""
    fn = Asking()

    async def main():
        b = Batcher(fn, max_batch_tokens=20, max_batch_size=4, max_queue_items=100, workers=2, name="w")
        fn.batcher = b
        await b.start()
        fn.gate.clear()
        first = asyncio.ensure_future(b.submit(["a"], costs=[10]))
        await _until(lambda: len(fn.seen) == 1)  # running, held at the gate
        second = asyncio.ensure_future(b.submit(["b1", "b2", "b3", "b4", "b5"], costs=[10] * 5))
        await _until(lambda: len(fn.seen) == 2)  # a full batch queued: started beside the first
        fn.gate.set()
        out = await asyncio.gather(first, second)
        await b.stop()
        return out

    out = asyncio.run(main())
    assert out == [[("out", "a")], [("out", f"b{i}") for i in range(1, 6)]]
    batches = [(items, share) for items, _, share in fn.seen]
    assert batches == [
        (["a"], False),  # nothing queued behind it
        (["b1", "b2"], True),  # b3..b5 left: 30 tokens, another full batch
        (["b3", "b4"], False),  # b5 left: 10 tokens, a partial batch that waits for this one
        (["b5"], False),  # nothing left
    ]
    assert all(thread.startswith("infer-w") for _, thread, _ in fn.seen)


def test_a_cheap_batch_shares_while_work_waits():
    """A size class known to be quick (here it then runs on the event loop): with work queued behind it, even a
    partial batch, the batch shares: more threads for a cheap batch cost more than they save while requests wait;
    alone, it takes every thread."""
    fn = Asking()

    async def main():
        b = Batcher(fn, max_batch_tokens=20, max_batch_size=4, max_queue_items=100, inline_below_s=0.01, workers=2,
                    name="loop")
        fn.batcher = b
        await b.start()
        assert await b.submit(["w"], costs=[10]) == [("out", "w")]  # its size class measured on the thread
        # queued together: y (10 tokens) and z (15) do not fit one batch (2 × 15 padded > 20), z alone is partial
        out = await asyncio.gather(b.submit(["y"], costs=[10]), b.submit(["z"], costs=[15]))
        await b.stop()
        return out

    assert asyncio.run(main()) == [[("out", "y")], [("out", "z")]]
    assert [(items, thread, share) for items, thread, share in fn.seen] == [
        (["w"], "infer-loop_0", False),
        (["y"], "MainThread", True),  # z waits behind it
        (["z"], "MainThread", False),  # alone
    ]


def test_with_one_worker_no_batch_shares():
    """One worker: no batch ever runs beside another, so even a batch with a full batch queued behind it, of a size
    known to be cheap, takes every thread."""
    fn = Asking()

    async def main():
        b = Batcher(fn, max_batch_tokens=20, max_batch_size=4, max_queue_items=100, inline_below_s=0.01, name="one")
        fn.batcher = b
        await b.start()
        assert await b.submit(["w"], costs=[10]) == [("out", "w")]
        out = await b.submit(["a", "b", "c", "d", "e", "f"], costs=[10] * 6)
        await b.stop()
        return out

    assert asyncio.run(main()) == [("out", x) for x in "abcdef"]
    assert [len(items) for items, _, _ in fn.seen] == [1, 2, 2, 2]
    assert not any(share for _, _, share in fn.seen)
