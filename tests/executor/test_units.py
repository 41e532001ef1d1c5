"""The pieces of core/executor that need no process: the arena allocator, the item and result encodings,
the device lists, and the single-process server's refusal of a device list."""

from __future__ import annotations

import numpy as np
import pytest

from core.devices import expand_devices, is_device_list, runtime_device
from core.engine import Registry
from core.errors import ConfigError
from core.executor import wire
from core.executor.shm import ALIGN, Allocator, Segment
from core.tasks.chunking import LateWindow, Window
from core.tasks.embed import AdapterEncoded
from core.tasks.late_interaction import TokenItem
from core.tasks.multi_output import M3Item, M3Output
from core.tasks.sparse import SparseVector
from core.tokenization import Encoded
from tests.executor.conftest import settings_for


def test_allocator_reuses_and_merges_freed_blocks():
    a = Allocator(10 * ALIGN)
    x, y, z = a.alloc(ALIGN), a.alloc(3 * ALIGN - 5), a.alloc(ALIGN)
    assert (x, y, z) == (0, ALIGN, 4 * ALIGN)
    assert a.alloc(6 * ALIGN) is None  # 5 blocks left at the end
    a.free(y)
    assert a.alloc(3 * ALIGN) == ALIGN  # first fit: the hole
    a.free(ALIGN)
    a.free(x)
    a.free(z)
    assert a.in_use == 0
    assert a.alloc(10 * ALIGN) == 0  # every block merged back into one


def roundtrip_items(items):
    layout, writer, costs = wire.encode_items(items)
    buf = bytearray(writer.nbytes + 16)
    writer.write(buf, 16)
    return wire.decode_items(layout, writer.table, buf, 16), costs


def ids(*values):
    return np.asarray(values, dtype=np.int64)


@pytest.mark.parametrize("items", [
    [Encoded(ids(101, 7, 102), ids(0, 0, 0)), Encoded(ids(101, 102), ids(0, 0), pool_from=1, all_tokens=True)],
    [AdapterEncoded(ids(1, 2), ids(0, 0), adapter=2), AdapterEncoded(ids(3), ids(0), adapter=2)],
    [Window(ids(1, 2, 3), ids(0, 0, 0), text=0), Window(ids(4, 5), ids(0, 1), text=1)],
    [LateWindow(ids(1, 2, 3), ids(0, 0, 0), keep=ids(0, 2)), LateWindow(ids(4), ids(0), keep=ids(0))],
    [TokenItem(ids(1, 2, 3), 2, np.array([True, False, True])), TokenItem(ids(5), 1, np.array([True]))],
    [M3Item(ids(1, 2), ids(0, 0), "pooled"), M3Item(ids(3), ids(0), "sparse", text=1)],
])
def test_items_cross_as_views_with_every_field(items):
    decoded, costs = roundtrip_items(items)
    assert costs == [it.cost for it in items]
    for got, want in zip(decoded, items):
        assert type(got) is type(want)
        for name in want.__dataclass_fields__:
            if name in wire.FRONT_END_ONLY:
                continue
            a, b = getattr(got, name), getattr(want, name)
            if isinstance(b, np.ndarray):
                assert a.dtype == b.dtype and np.array_equal(a, b), name
            else:
                assert a == b, name


def test_late_window_chunks_stay_in_the_front_end():
    (got,), _ = roundtrip_items([LateWindow(ids(1, 2), ids(0, 0), keep=ids(0), chunks=[ids(0, 1)])])
    assert got.chunks is None


def roundtrip_results(results):
    desc, writer = wire.encode_results(results)
    buf = bytearray(writer.nbytes)
    writer.write(buf, 0)
    return wire.decode_results(desc, len(results), writer.table, buf, 0)


@pytest.mark.parametrize("results", [
    [np.arange(4, dtype=np.float32), np.ones(4, np.float32)],  # pooled vectors: one stacked array
    [np.ones((3, 2), np.float32), np.zeros((1, 2), np.float32)],  # per-token vectors: ragged
    [0.5, -1.25, 3.0],  # scores
    [SparseVector(ids(3, 9), np.array([0.5, 1.0], np.float32)), SparseVector(ids(), np.zeros(0, np.float32))],
    [M3Output(pooled=np.ones(2, np.float32)), M3Output(sparse=SparseVector(ids(1), np.ones(1, np.float32))),
     M3Output(colbert=np.ones((2, 2), np.float32))],
    [],
])
def test_results_cross_by_column(results):
    got = roundtrip_results(results)
    assert len(got) == len(results)
    for a, b in zip(got, results):
        if isinstance(b, np.ndarray):
            assert a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
        elif isinstance(b, float):
            assert a == b
        else:
            assert type(a) is type(b)
            for name in b.__dataclass_fields__:
                x, y = getattr(a, name), getattr(b, name)
                if y is None:
                    assert x is None
                elif isinstance(y, SparseVector):
                    assert np.array_equal(x.indices, y.indices) and np.array_equal(x.values, y.values)
                else:
                    assert np.array_equal(x, y)


def test_an_unknown_class_is_refused():
    with pytest.raises(Exception, match="unknown class"):
        wire.resolve_class("os:system")


def test_segments_attach_and_unlink():
    created = Segment.create("tessera-unit", 4096)
    try:
        other = Segment.attach(created.name)
        np.frombuffer(created.map, np.int64, 1, 64)[0] = 42
        assert np.frombuffer(other.map, np.int64, 1, 64)[0] == 42
        other.close()
    finally:
        created.unlink()
        created.close()
    with pytest.raises(FileNotFoundError):
        Segment.attach(created.name)


def test_device_lists(tmp_path):
    gpus = tmp_path / "proc" / "driver" / "nvidia" / "gpus"
    for bus in ("0000:01:00.0", "0000:02:00.0", "0000:03:00.0"):
        (gpus / bus).mkdir(parents=True)
    assert expand_devices("cuda:*", {}, tmp_path) == ["cuda:0", "cuda:1", "cuda:2"]
    assert expand_devices("cuda:*", {"CUDA_VISIBLE_DEVICES": "5,7"}, tmp_path) == ["cuda:0", "cuda:1"]
    assert expand_devices("cuda:0, cuda:1", {}, tmp_path) == ["cuda:0", "cuda:1"]
    assert expand_devices("cpu:0,cpu:1", {}, tmp_path) == ["cpu:0", "cpu:1"]
    assert expand_devices("cpu", {}, tmp_path) == ["cpu:0"]
    assert runtime_device("cpu:1") == "cpu" and runtime_device("cuda:1") == "cuda:1"
    assert is_device_list("cuda:*") and is_device_list("cpu:0,cpu:1") and not is_device_list("cuda:1")
    with pytest.raises(ValueError, match="no GPU"):
        expand_devices("cuda:*", {"CUDA_VISIBLE_DEVICES": ""}, tmp_path)
    with pytest.raises(ValueError, match="twice"):
        expand_devices("cpu:0,cpu:0", {}, tmp_path)


def test_the_single_process_server_refuses_a_device_list(minilm_onnx_dir):
    settings = settings_for({"path": minilm_onnx_dir, "name": "emb", "backend": "onnx", "device": "cpu:0,cpu:1"})
    with pytest.raises(ConfigError, match="frontends > 1"):
        Registry.from_settings(settings)
