"""Static-shape bucket logic (core/backends/buckets.py), the part of the Neuron backend that runs here.

The pure functions are checked on their own; the router and the bucketed backend are driven by a real
static-shape runtime: MiniLM exported to ONNX with FIXED (batch, sequence) dimensions per bucket
(tests/support/static_onnx.py), compared with the dynamic-shape ONNX/torch results on the same inputs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from core.backends.buckets import (Bucket, BucketRouter, Manifest, ManifestEntry, choose_bucket, pad_to_bucket,
                                   plan_buckets, strip_padding)
from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import InvalidInput, TooLarge
from core.tasks.embed import EmbedRequest
from core.tokenization import TextTokenizer, pad_batch
from tests.conftest import STATIC_BATCHES, STATIC_LENGTHS
from tests.support.static_onnx import StaticOnnxBackend

SETTINGS = Settings(threads=2)


# ---- planning and choice (pure) -------------------------------------------------------------------

def test_plan_is_the_product_sorted_by_length_then_batch():
    plan = plan_buckets([32, 1, 8], [512, 128, 256], max_positions=512)
    assert len(plan) == 9
    assert plan[0] == Bucket(1, 128) and plan[-1] == Bucket(32, 512)
    assert plan == sorted(plan)
    assert [(b.batch_size, b.sequence_length) for b in plan[:4]] == [(1, 128), (8, 128), (32, 128), (1, 256)]
    assert Bucket(8, 256).dirname == "b8_s256" and Bucket(8, 256).tokens == 2048


@pytest.mark.parametrize("batches,lengths,message", [
    ([], [128], "at least one batch size"),
    ([0, 8], [128], "positive integer"),
    ([8, 8], [128], "duplicate batch size"),
    ([1], [128, 1024], "exceeds the model's 512 positions"),
])
def test_plan_refuses_bad_sizes(batches, lengths, message):
    with pytest.raises(InvalidInput, match=message):
        plan_buckets(batches, lengths, max_positions=512)


def test_choose_smallest_fitting_bucket():
    buckets = plan_buckets([1, 8, 32], [128, 256, 512])
    assert choose_bucket(buckets, 1, 10) == Bucket(1, 128)
    assert choose_bucket(buckets, 2, 10) == Bucket(8, 128)
    assert choose_bucket(buckets, 8, 128) == Bucket(8, 128)
    assert choose_bucket(buckets, 8, 129) == Bucket(8, 256)
    assert choose_bucket(buckets, 9, 300) == Bucket(32, 512)
    assert choose_bucket(buckets, 1, 500) == Bucket(1, 512)
    assert choose_bucket(buckets, 2, 200) == Bucket(8, 256)
    assert choose_bucket(buckets, 33, 10) is None  # needs a split
    assert choose_bucket(buckets, 1, 513) is None  # too long for any bucket
    # fewest padded tokens wins over the shorter sequence: 2 × 200 fits (8, 256) = 2048 tokens,
    # not (32, 512); and with only (32, 128) and (1, 256): one 100-token item takes (1, 256) (256 < 4096)
    assert choose_bucket([Bucket(32, 128), Bucket(1, 256)], 1, 100) == Bucket(1, 256)


def test_pad_to_bucket_and_strip_padding_round_trip():
    inputs = {"input_ids": np.array([[101, 7, 102], [101, 102, 0]]),
              "attention_mask": np.array([[1, 1, 1], [1, 1, 0]]),
              "token_type_ids": np.zeros((2, 3), dtype=np.int64)}
    padded = pad_to_bucket(inputs, Bucket(4, 8), pad_id=0)
    assert all(v.shape == (4, 8) for v in padded.values())
    assert padded["input_ids"][0].tolist() == [101, 7, 102, 0, 0, 0, 0, 0]
    assert padded["attention_mask"][:2].sum() == 5
    assert padded["attention_mask"][2:].tolist() == [[1, 0, 0, 0, 0, 0, 0, 0]] * 2  # filler rows: no all-masked row
    hidden = np.arange(4 * 8 * 2, dtype=np.float32).reshape(4, 8, 2)
    stripped = strip_padding({"last_hidden_state": hidden, "pooled": hidden[:, 0]}, 2, 3, Bucket(4, 8))
    np.testing.assert_array_equal(stripped["last_hidden_state"], hidden[:2, :3])
    np.testing.assert_array_equal(stripped["pooled"], hidden[:2, 0])


class Recording:
    """A static-shape function standing in for nothing but arithmetic: it checks the shape it is given
    is its bucket's and returns per-token values derived from the inputs (so un-padding is checkable)."""

    def __init__(self):
        self.calls: list[tuple[Bucket, int]] = []

    def __call__(self, bucket, padded):
        assert padded["input_ids"].shape == (bucket.batch_size, bucket.sequence_length)
        self.calls.append((bucket, int(padded["attention_mask"].sum())))
        ids = padded["input_ids"].astype(np.float32)
        return {"last_hidden_state": np.stack([ids, ids * padded["attention_mask"]], axis=-1)}


def test_router_splits_oversize_batches_and_keeps_order():
    buckets = plan_buckets([1, 4], [16, 64])
    fn = Recording()
    router = BucketRouter(buckets, fn, pad_id=0)
    lengths = [3, 5, 9, 16, 2, 40, 7, 1, 11, 64]
    ids = np.zeros((len(lengths), 64), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = np.arange(1, n + 1) + 100 * row
        mask[row, :n] = 1
    out = router.run({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    hidden = out["last_hidden_state"]
    assert hidden.shape == (10, 64, 2)
    np.testing.assert_array_equal(hidden[..., 1], ids * mask)  # every row back in place, padding stripped
    assert all(b.batch_size <= 4 for b, _ in fn.calls) and len(fn.calls) == 3
    assert [b for b, _ in fn.calls] == [Bucket(4, 16), Bucket(4, 64), Bucket(4, 64)]
    assert sum(real for _, real in fn.calls) - 2 == sum(lengths)  # + one attended token per filler row (2)


def test_router_refuses_or_truncates_over_long_inputs():
    buckets = plan_buckets([1, 4], [16])
    ids = np.ones((2, 20), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[0, 10:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask}
    with pytest.raises(TooLarge, match=r"input\[1\] has 20 tokens.*at most 16"):
        BucketRouter(buckets, Recording()).run(feeds)
    out = BucketRouter(buckets, Recording(), overflow="truncate").run(feeds)
    assert out["last_hidden_state"].shape == (2, 16, 2)


def test_manifest_round_trip_and_refusals(tmp_path):
    manifest = Manifest([ManifestEntry(Bucket(8, 128), "b8_s128"), ManifestEntry(Bucket(1, 128), "b1_s128")],
                        source="m", dtype="bf16")
    manifest.write(tmp_path)
    back = Manifest.read(tmp_path)
    assert back.buckets == [Bucket(1, 128), Bucket(8, 128)] and back.dtype == "bf16"
    assert json.loads((tmp_path / "manifest.json").read_text())["format"] == 1
    with pytest.raises(InvalidInput, match="compile the model first"):
        Manifest.read(tmp_path / "nothing")
    for bad, message in (({"format": 2, "buckets": []}, "unknown manifest format"),
                         ({"format": 1, "buckets": []}, "lists no buckets"),
                         ({"format": 1, "buckets": [{"batch_size": 1}]}, "malformed bucket"),
                         ({"format": 1, "buckets": [{"batch_size": 1, "sequence_length": 8, "path": "a"}] * 2},
                          "duplicate")):
        (tmp_path / "manifest.json").write_text(json.dumps(bad))
        with pytest.raises(InvalidInput, match=message):
            Manifest.read(tmp_path)


# ---- driven by a real fixed-shape runtime ---------------------------------------------------------

@pytest.fixture(scope="module")
def static_backend(minilm_static_buckets_dir):
    backend = StaticOnnxBackend.from_spec(ModelSpec(path=minilm_static_buckets_dir))
    backend.load(minilm_static_buckets_dir, head="encoder", device="cpu", dtype="float32", threads=2)
    return backend


@pytest.fixture
def static_engine(minilm_static_buckets_dir, monkeypatch):
    """The real Engine.load with the static ONNX buckets registered as a backend (in the Neuron's place)."""
    from core.backends import catalog

    monkeypatch.setitem(catalog.BACKENDS, "static-onnx", "tests.support.static_onnx:StaticOnnxBackend")
    return Engine.load(ModelSpec(path=minilm_static_buckets_dir, backend="static-onnx"), SETTINGS)


@pytest.fixture(scope="module")
def dynamic_onnx(minilm_onnx_dir):
    spec = ModelSpec(path=minilm_onnx_dir, backend="onnx")
    return Engine.load(spec, SETTINGS)


def test_static_graphs_really_are_static(minilm_static_buckets_dir):
    import onnxruntime as ort

    session = ort.InferenceSession(str(minilm_static_buckets_dir / "neuron" / "b4_s16" / "model.onnx"),
                                   providers=["CPUExecutionProvider"])
    assert [tuple(i.shape) for i in session.get_inputs()] == [(4, 16)] * 3
    with pytest.raises(Exception, match="(?i)dimension|shape"):
        session.run(None, {i.name: np.ones((2, 16), dtype=np.int64) for i in session.get_inputs()})


def test_manifest_written_by_the_compile_pipeline(minilm_static_buckets_dir):
    manifest = Manifest.read(minilm_static_buckets_dir / "neuron")
    assert manifest.buckets == plan_buckets(STATIC_BATCHES, STATIC_LENGTHS)
    assert manifest.runtime == "onnx-static" and manifest.head == "encoder"
    assert all((minilm_static_buckets_dir / "neuron" / e.path / "model.onnx").exists() for e in manifest.entries)
    assert (minilm_static_buckets_dir / "tokenizer.json").exists()  # the folder serves as it is


def test_padded_then_unpadded_equals_the_unpadded_dynamic_result(static_backend, dynamic_onnx, minilm_dir,
                                                                  sentences):
    """Batches of every size 1..9 (oversize ones split) and lengths up to 64: the static buckets' token
    vectors, un-padded, equal the dynamic graph's on the same unpadded batch."""
    tok = TextTokenizer(minilm_dir, max(STATIC_LENGTHS))
    items = tok.encode(sentences)
    used = set()
    start = 0
    longest = max(items, key=lambda it: it.cost)
    for size in [*range(1, 10), "longest alone"]:
        if size == "longest alone":
            chunk = [longest]
        else:
            chunk = items[start:start + size]
            start += size
        feeds = pad_batch(chunk, tok.pad_id)
        before = dict(static_backend.router.calls)
        got = static_backend.run(feeds)["last_hidden_state"]
        want = dynamic_onnx.backend.run(feeds)["last_hidden_state"]
        assert got.shape == want.shape
        mask = feeds["attention_mask"].astype(bool)
        np.testing.assert_allclose(got[mask], want[mask], atol=2e-4, rtol=1e-3)
        used |= {b for b, n in static_backend.router.calls.items() if n > before[b]}
    assert used == set(plan_buckets(STATIC_BATCHES, STATIC_LENGTHS)), "every bucket was exercised"


def test_engine_on_buckets_matches_sentence_transformers(static_engine, st_minilm, sentences):
    """The whole serving path: tokenizer capped at the largest bucket, batcher sized to the largest batch."""
    engine = static_engine
    assert engine.backend.describe()["buckets"] == ["1x16", "4x16", "1x64", "4x64"]
    assert engine.task.info.max_length == max(STATIC_LENGTHS)
    assert engine.batcher.max_batch_size == max(STATIC_BATCHES)
    original = st_minilm.max_seq_length
    st_minilm.max_seq_length = max(STATIC_LENGTHS)
    try:
        want = st_minilm.encode(sentences, batch_size=16)
    finally:
        st_minilm.max_seq_length = original
    got = engine.run_sync(EmbedRequest(texts=sentences)).vectors
    cos = (got * want).sum(axis=1)
    assert cos.min() >= 0.9999, cos.min()


def test_engine_refuses_over_long_input_when_truncate_is_false(static_engine, sentences):
    longest = max(sentences, key=len)
    with pytest.raises(TooLarge, match="more than the model's maximum of 64"):
        static_engine.run_sync(EmbedRequest(texts=[longest], truncate=False))
    assert static_engine.run_sync(EmbedRequest(texts=[longest])).prompt_tokens == 64


def test_buckets_longer_than_the_model_limit_do_not_raise_it(minilm_dir, tmp_path, monkeypatch):
    """The largest bucket caps the model's max length; it never lengthens it (MiniLM: 256 < 300)."""
    from core.backends import catalog
    from core.convert.neuron import compile_buckets
    from tests.support.static_onnx import export_static

    compile_buckets(minilm_dir, tmp_path, batch_sizes=[1], sequence_lengths=[300], compile_bucket=export_static,
                    runtime="onnx-static", dtype="float32")
    monkeypatch.setitem(catalog.BACKENDS, "static-onnx", "tests.support.static_onnx:StaticOnnxBackend")
    engine = Engine.load(ModelSpec(path=tmp_path, backend="static-onnx"), SETTINGS)
    assert engine.backend.max_sequence_length == 300
    assert engine.task.info.max_length == 256
    result = engine.run_sync(EmbedRequest(texts=["word " * 400]))
    assert result.prompt_tokens == 256
