"""``python -m core batch-transform prepare / collect``: a corpus through SageMaker Batch Transform's formats.

The transform itself is the SageMaker Python SDK's own local-mode loop (``_LocalTransformJob``: its file
listing, ``SplitType=Line`` splitter, ``MultiRecord`` batching under ``MaxPayloadInMB``, ``.out`` naming and
``AssembleWith=Line``), with its requests sent to the real SageMaker serving process (adapters/sagemaker/serve)
instead of a Docker container; the collected file is compared with the local job's for the same corpus."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.adapters.conftest import sagemaker_process
from tests.bulk.conftest import corpus, write_jsonl
from tests.bulk.test_embed_job import job_env, read
from tests.support.server import ROOT

SERVED = "minilm-bt"


@pytest.fixture(scope="module")
def model_root(tmp_path_factory, minilm_onnx_dir) -> Path:
    """An unpacked model tarball: tessera.yaml + the fp32 ONNX MiniLM folder (symlinks)."""
    root = tmp_path_factory.mktemp("opt-ml-model")
    folder = root / "minilm"
    (folder / "onnx").mkdir(parents=True)
    for item in minilm_onnx_dir.iterdir():
        if item.is_file():
            (folder / item.name).symlink_to(item)
    (folder / "onnx" / "model.onnx").symlink_to(minilm_onnx_dir / "onnx" / "model.onnx")
    (root / "tessera.yaml").write_text(f"models:\n  - path: minilm\n    name: {SERVED}\n    backend: onnx\n")
    return root


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "core", *args], cwd=ROOT, env=job_env(), capture_output=True,
                          text=True, timeout=600)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


class _Runtime:
    """``invoke_endpoint`` of the SDK's local session, answered by the serving process at ``base``."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.calls = 0

    def invoke_endpoint(self, body, endpoint_name, content_type, accept):
        import io

        self.calls += 1
        reply = httpx.post(self.base + "/invocations", timeout=300, content=body.encode() if isinstance(body, str)
                           else body, headers={"Content-Type": content_type, "Accept": accept})
        assert reply.status_code == 200, reply.text[:300]
        return {"Body": io.BytesIO(reply.content)}


def batch_transform(base: str, records: Path, results: Path, max_payload_mb: int) -> int:
    """SageMaker local mode's transform loop over ``records`` into ``results``; returns the mini-batches sent."""
    from sagemaker.core.local.entities import _LocalTransformJob

    job = _LocalTransformJob.__new__(_LocalTransformJob)
    runtime = _Runtime(base)
    job.local_session = type("Session", (), {"config": None, "sagemaker_runtime_client": runtime})()
    job.container = type("Container", (), {"stop_serving": lambda self: None})()
    job.name = "tessera-bt"
    job._perform_batch_inference(
        {"DataSource": {"S3DataSource": {"S3Uri": f"file://{records}"}}, "SplitType": "Line",
         "ContentType": "application/jsonlines"},
        {"S3OutputPath": f"file://{results}", "Accept": "application/jsonlines", "AssembleWith": "Line"},
        BatchStrategy="MultiRecord", MaxPayloadInMB=max_payload_mb)
    return runtime.calls


def container_env(max_payload_mb: int) -> dict[str, str]:
    from sagemaker.core.local.entities import _LocalTransformJob

    job = _LocalTransformJob.__new__(_LocalTransformJob)
    job.primary_container = {"Environment": {}}
    return job._get_container_environment(MaxPayloadInMB=max_payload_mb, BatchStrategy="MultiRecord")


def test_prepared_records_through_the_sagemaker_container_collect_into_the_local_jobs_parquet(tmp_path, model_root):
    texts = corpus(1500, repeats=150, seed=5)
    texts[7] = "x " * 400  # longer than the model's 256 tokens: truncated the same way on both routes
    ids = [f"doc-{i * 3}" for i in range(len(texts))]
    source = write_jsonl(tmp_path / "corpus.jsonl", texts, ids)
    model = f"path={model_root / 'minilm'},name={SERVED},backend=onnx"
    common = ["--input", str(source), "--id-column", "doc_id", "--model", model, "--threads", "2"]
    local = tmp_path / "local.parquet"
    cli("embed", *common, "--output", str(local))

    prepared = tmp_path / "prepared"
    done = cli("batch-transform", "prepare", *common, "--output", str(prepared), "--records-per-file", "600")
    assert "rows: 1500 in 3 records file(s)" in done.stdout
    files = sorted(p.name for p in (prepared / "records").iterdir())
    assert files == ["part-00000.jsonl", "part-00001.jsonl", "part-00002.jsonl"]  # the manifest is not an input
    first = json.loads((prepared / "records" / files[0]).read_text().splitlines()[0])
    assert first == {"id": "doc-0", "input": texts[0], "encoding_format": "base64"}

    results = tmp_path / "results"
    # 1 MB mini-batches: each 600-record file (≈ 100 KB) is one; the container runs with the job's environment
    with sagemaker_process(model_root, container_env(1)) as (base, _proc):
        calls = batch_transform(base, prepared / "records", results, 1)
    assert calls == 3
    assert sorted(p.name for p in results.iterdir()) == [f + ".out" for f in files]

    collected = tmp_path / "collected.parquet"
    done = cli("batch-transform", "collect", "--prepared", str(prepared), "--results", str(results),
               "--output", str(collected))
    assert "rows: 1500 (1500 this run, 0 done before)" in done.stdout
    local_table, local_vectors = read(local)
    table, vectors = read(collected)
    assert table.schema == local_table.schema  # id and vector types, and the metadata (model identity, options)
    assert table.schema.metadata == local_table.schema.metadata
    assert table.column("doc_id").to_pylist() == ids
    np.testing.assert_allclose(vectors, local_vectors, atol=2e-5)
    assert not (tmp_path / "collected.parquet.parts").exists()
    # the local job's command, pointed at the collected file, finds its own output: no model work
    again = cli("embed", *common, "--output", str(collected))
    assert "already complete (1500 rows); nothing to do" in again.stdout

    # JoinSource=Input: SageMaker writes each record with its answer under SageMakerOutput (AWS, DataProcessing)
    joined = tmp_path / "joined"
    joined.mkdir()
    for name in files:
        records = (prepared / "records" / name).read_text().splitlines()
        answers = [line for line in (results / (name + ".out")).read_text().splitlines() if line.strip()]
        assert len(answers) == len(records)
        lines = [json.dumps({**json.loads(r), "SageMakerOutput": json.loads(a)}) for r, a in zip(records, answers)]
        (joined / (name + ".out")).write_text("\n".join(lines) + "\n")
    from_join = tmp_path / "from-join.parquet"
    cli("batch-transform", "collect", "--prepared", str(prepared), "--results", str(joined), "--output", str(from_join))
    assert pq.read_table(from_join).equals(pq.read_table(collected))

    # a joined file whose lines are not the prepared order is refused, naming the line
    swapped = joined / "part-00001.jsonl.out"
    lines = swapped.read_text().splitlines()
    lines[3], lines[4] = lines[4], lines[3]
    swapped.write_text("\n".join(lines) + "\n")
    refused = cli("batch-transform", "collect", "--prepared", str(prepared), "--results", str(joined), "--output",
                  str(tmp_path / "x.parquet"), check=False)
    assert refused.returncode == 1 and "line 4 (id 'doc-1809')" in refused.stderr and "joins the record" in refused.stderr

    # a record that failed in the container (its error line) fails the collect, naming its id; no output
    broken = tmp_path / "broken"
    shutil.copytree(results, broken)
    out = broken / "part-00002.jsonl.out"
    lines = [line for line in out.read_text().splitlines() if line.strip()]
    lines[10] = json.dumps({"error": {"message": "input is too long", "type": "invalid_request_error", "param": None,
                                      "code": "input_too_long"}})
    out.write_text("\n".join(lines[:-1]) + "\n")  # and one answer short
    refused = cli("batch-transform", "collect", "--prepared", str(prepared), "--results", str(broken), "--output",
                  str(tmp_path / "y.parquet"), check=False)
    assert refused.returncode == 1 and "299 answer(s) for the 300 records" in refused.stderr
    out.write_text("\n".join(lines) + "\n")
    refused = cli("batch-transform", "collect", "--prepared", str(prepared), "--results", str(broken), "--output",
                  str(tmp_path / "y.parquet"), check=False)
    assert refused.returncode == 1 and "id 'doc-3630': input is too long" in refused.stderr
    assert not (tmp_path / "y.parquet").exists()


def test_quantized_and_matryoshka_options_travel_in_the_records(tmp_path, model_root):
    texts = corpus(200, seed=9)
    source = write_jsonl(tmp_path / "corpus.jsonl", texts)
    model = f"path={model_root / 'minilm'},name={SERVED},backend=onnx"
    common = ["--input", str(source), "--model", model, "--threads", "2", "--embedding-type", "int8",
              "--dimensions", "128", "--prompt", "query: "]
    local = tmp_path / "local.parquet"
    cli("embed", *common, "--output", str(local))
    prepared = tmp_path / "prepared"
    cli("batch-transform", "prepare", *common, "--output", str(prepared))
    first = json.loads((prepared / "records" / "part-00000.jsonl").read_text().splitlines()[0])
    assert first == {"id": 0, "input": texts[0], "encoding_format": "base64", "dimensions": 128, "prompt": "query: ",
                     "embedding_type": "int8"}
    results = tmp_path / "results"
    with sagemaker_process(model_root, container_env(1)) as (base, _proc):
        batch_transform(base, prepared / "records", results, 1)
    collected = tmp_path / "collected.parquet"
    cli("batch-transform", "collect", "--prepared", str(prepared), "--results", str(results), "--output", str(collected))
    local_table, table = pq.read_table(local), pq.read_table(collected)
    kind = table.schema.field("embedding").type
    assert str(kind.value_type) == "int8" and kind.list_size == 128
    assert table.schema == local_table.schema and table.schema.metadata == local_table.schema.metadata
    assert table.column("id").to_pylist() == list(range(200))
    a, b = (np.asarray(t.column("embedding").combine_chunks().flatten(), np.int16) for t in (local_table, table))
    assert np.abs(a - b).max() <= 1  # int8 levels: equal but for a rounding step where a float sits on the edge


def test_collect_without_a_manifest_or_with_another_models_answers_is_a_clear_error(tmp_path, model_root):
    """Also through URIs (pyarrow's filesystems, as s3:// goes): file:// here."""
    for prepared in (str(tmp_path), f"file://{tmp_path}"):
        refused = cli("batch-transform", "collect", "--prepared", prepared, "--results", str(tmp_path),
                      "--output", str(tmp_path / "o.parquet"), check=False)
        assert refused.returncode == 1 and "no tessera-batch.json" in refused.stderr, refused.stderr
    source = write_jsonl(tmp_path / "corpus.jsonl", corpus(5, seed=1))
    prepared = tmp_path / "prepared"
    cli("batch-transform", "prepare", "--input", str(source), "--output", f"file://{prepared}", "--model",
        f"path={model_root / 'minilm'},name={SERVED},backend=onnx", "--threads", "2")
    assert len((prepared / "records" / "part-00000.jsonl").read_text().splitlines()) == 5
    results = tmp_path / "results"
    results.mkdir()
    answer = {"object": "list", "model": "another-model", "usage": {"prompt_tokens": 1, "total_tokens": 1},
              "data": [{"object": "embedding", "index": 0, "embedding": "AACAPw=="}]}
    (results / "part-00000.jsonl.out").write_text((json.dumps(answer) + "\n") * 5)
    refused = cli("batch-transform", "collect", "--prepared", f"file://{prepared}", "--results", f"file://{results}",
                  "--output", str(tmp_path / "o.parquet"), check=False)
    assert refused.returncode == 1 and "answered by model 'another-model'" in refused.stderr
