"""SageMaker Batch Transform with mini-batches as large as the job packs them.

With ``BatchStrategy=MultiRecord`` SageMaker puts as many records in one request as ``MaxPayloadInMB`` holds
(botocore's ``CreateTransformJob.BatchStrategy``; the SageMaker Python SDK's local transform packs the same way:
``sagemaker.core.local.data.MultiRecordStrategy.pad``). The job is the SDK's own local-mode loop
(``sagemaker.core.local.entities._LocalTransformJob._perform_batch_inference``: its ``SplitType=Line`` splitter,
``MultiRecord`` packing, ``.out`` naming and ``AssembleWith=Line`` writing), sent to the real ``serve``.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import orjson

from tests.adapters.conftest import sagemaker_process
from tests.adapters.contract import MODEL
from tests.bulk.conftest import corpus, write_jsonl
from tests.bulk.test_batch_transform import batch_transform, cli, container_env

ATTRS = "X-Amzn-SageMaker-Custom-Attributes"
RECORDS = 10_000


def _packed_mini_batches(records_file, max_payload_mb: int) -> list[str]:
    """The mini-batches the SDK's ``MultiRecordStrategy`` packs from ``records_file`` under ``MaxPayloadInMB``."""
    from sagemaker.core.local.data import LineSplitter, MultiRecordStrategy

    return list(MultiRecordStrategy(LineSplitter()).pad(str(records_file), max_payload_mb))


def test_a_mini_batch_of_ten_thousand_records_is_answered_whole_and_collects(tmp_path, sagemaker_model_dir):
    """10,000 short records (past 4 x max_items_per_request) in ONE mini-batch at MaxPayloadInMB=6: every record
    answered, in order, and ``python -m core batch-transform collect`` reads the ``.out`` back, one vector per
    record (before: 413 too_many_records, which SageMaker retries and then fails the job with)."""
    texts = corpus(RECORDS, seed=11)
    source = write_jsonl(tmp_path / "corpus.jsonl", texts, [f"d{i}" for i in range(RECORDS)])
    model = f"path={sagemaker_model_dir / MODEL},name={MODEL},backend=onnx,dtype=int8"
    common = ["--input", str(source), "--id-column", "doc_id", "--model", model, "--threads", "2"]
    prepared = tmp_path / "prepared"
    cli("batch-transform", "prepare", *common, "--output", str(prepared), "--records-per-file", str(RECORDS))
    records_file = prepared / "records" / "part-00000.jsonl"
    packed = _packed_mini_batches(records_file, 6)
    assert len(packed) == 1 and packed[0].count("\n") == RECORDS  # the SDK packs them all into one request

    results = tmp_path / "results"
    with sagemaker_process(sagemaker_model_dir, container_env(6)) as (base, _proc):
        assert batch_transform(base, prepared / "records", results, 6) == 1
        check = [0, 2047, 2048, 7777, RECORDS - 1]  # either side of a window's edge, and the last
        direct = httpx.post(base + "/invocations", timeout=60, content=orjson.dumps({"input": [texts[i] for i in check]}),
                            headers={"Content-Type": "application/json", ATTRS: "route=embeddings"}).json()
    out = (results / "part-00000.jsonl.out").read_bytes()
    answers = [orjson.loads(line) for line in out.splitlines() if line.strip()]
    assert len(answers) == RECORDS and all("data" in a for a in answers)
    for row, i in enumerate(check):
        got = np.frombuffer(__import__("base64").b64decode(answers[i]["data"][0]["embedding"]), "<f4")
        np.testing.assert_allclose(got, direct["data"][row]["embedding"], atol=1e-5)

    collected = tmp_path / "collected.parquet"
    done = cli("batch-transform", "collect", "--prepared", str(prepared), "--results", str(results),
               "--output", str(collected))
    assert f"rows: {RECORDS} ({RECORDS} this run, 0 done before)" in done.stdout


def test_a_real_time_request_over_the_item_limit_is_still_refused(sagemaker_server):
    """Outside Batch Transform (InvokeEndpoint: 60 s, 6 MB answers) a JSON Lines body of more records than one
    request may carry inputs is refused, naming the ways out that work there."""
    body = b"".join(orjson.dumps({"input": "a"}) + b"\n" for _ in range(2049))
    reply = httpx.post(sagemaker_server + "/invocations", content=body, timeout=60,
                       headers={"Content-Type": "application/jsonlines", ATTRS: "route=embeddings"})
    assert reply.status_code == 413
    error = reply.json()["error"]
    assert error["code"] == "too_many_records" and "Batch Transform" in error["message"]
    assert "MaxPayloadInMB" not in error["message"]
    assert json.loads(httpx.get(sagemaker_server + "/ping", timeout=10).text)  # the server stays up
