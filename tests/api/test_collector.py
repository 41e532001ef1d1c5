"""The cyclic garbage collector while serving (core/collector.py): what the start-up built is set aside, the
youngest generation's threshold raised; garbage made while serving is still collected; all undone at stop."""

from __future__ import annotations

import gc
import weakref

import pytest

from core.collector import YOUNG_OBJECTS, tune_for_serving
from tests.api.conftest import client_for


@pytest.fixture
def default_collector():
    """Python's own thresholds for the test, the process's own restored after it."""
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)


class Node:
    def __init__(self):
        self.other = None


def _cycle_collected() -> bool:
    """A reference cycle made now is freed by a collection (freezing old objects leaves new ones collectable)."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    return gone() is None


def test_tune_and_restore(default_collector):
    kept = Node()
    restore = tune_for_serving()
    try:
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_OBJECTS, 10, 10)
        assert not any(o is kept for o in gc.get_objects())  # set aside: no generation walks it
        assert _cycle_collected()
    finally:
        restore()
    assert gc.get_freeze_count() == 0
    assert any(o is kept for o in gc.get_objects())
    assert gc.get_threshold() == (700, 10, 10)


def test_a_higher_threshold_of_the_process_is_kept(default_collector):
    gc.set_threshold(50_000, 10, 10)
    restore = tune_for_serving()
    assert gc.get_threshold() == (50_000, 10, 10)
    restore()
    assert gc.get_threshold() == (50_000, 10, 10)


def test_the_app_tunes_while_it_serves_and_restores_at_stop(default_collector, minilm_onnx_dir):
    with client_for(models=[{"path": str(minilm_onnx_dir), "name": "minilm"}]) as client:
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] == YOUNG_OBJECTS
        for _ in range(3):
            r = client.post("/v1/embeddings", json={"model": "minilm", "input": "a short text"})
            assert r.status_code == 200, r.text
        assert _cycle_collected()
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() == 0
