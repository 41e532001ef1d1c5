"""``python -m core embed``: formats, ids, metadata, repeats, resume after SIGKILL, a finished job."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from core.bulk.job import JobError, JobOptions, run_local
from core.config import Settings
from core.inprocess import AsyncModels
from tests.bulk.conftest import corpus, write_jsonl
from tests.support.server import ROOT, environ_without_settings


def settings_for(model: dict, **extra) -> Settings:
    return Settings(models=[model], threads=2, **extra)


def run(settings, **options):
    return asyncio.run(run_local(settings, JobOptions(**options)))


def reference(settings, texts, **options) -> np.ndarray:
    async def go():
        async with AsyncModels(settings) as engine:
            return await engine.embed(texts, **options)

    return asyncio.run(go())


def read(path):
    table = pq.read_table(path)
    return table, np.asarray(table.column("embedding").combine_chunks().flatten()).reshape(table.num_rows, -1)


@pytest.fixture(scope="module")
def texts():
    return corpus(240, repeats=24)


@pytest.fixture(scope="module")
def expected(job_model, texts):
    return reference(settings_for(job_model), texts)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv", "text"])
def test_every_input_format_gives_the_engines_vectors_with_row_numbers_as_ids(tmp_path, job_model, texts, expected,
                                                                             fmt):
    source = tmp_path / f"corpus.{ {'text': 'txt'}.get(fmt, fmt) }"
    if fmt == "parquet":
        pq.write_table(pa.table({"text": texts}), source, row_group_size=50)
    elif fmt == "jsonl":
        write_jsonl(source, texts)
    elif fmt == "csv":
        pacsv.write_csv(pa.table({"text": texts}), source)
    else:
        source.write_text("\n".join(texts) + "\n")
    out = tmp_path / "out.parquet"
    summary = run(settings_for(job_model), input=str(source), output=str(out), rows_per_part=70)
    table, vectors = read(out)
    assert table.column_names == ["id", "embedding"]
    assert table.column("id").to_pylist() == list(range(len(texts)))
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 384)
    np.testing.assert_allclose(vectors, expected, atol=2e-5)
    assert summary.rows == len(texts) and not (tmp_path / "out.parquet.parts").exists()


def test_repeated_texts_are_embedded_once_and_counted(tmp_path, job_model, texts):
    source = write_jsonl(tmp_path / "c.jsonl", texts)
    summary = run(settings_for(job_model), input=str(source), output=str(tmp_path / "o.parquet"), rows_per_part=64)
    distinct = len(set(texts))
    assert (summary.computed, summary.repeated) == (distinct, len(texts) - distinct)
    assert summary.computed <= 0.91 * len(texts)  # 10% repeated: at most 91% of the model work


def test_ids_from_a_column_and_the_job_in_the_files_metadata(tmp_path, job_model, texts):
    ids = [f"doc-{i:04d}" for i in range(len(texts))]
    source = tmp_path / "c.parquet"
    pq.write_table(pa.table({"body": texts, "doc_id": ids}), source)
    out = tmp_path / "o.parquet"
    run(settings_for(job_model), input=str(source), output=str(out), text_column="body", id_column="doc_id",
        dimensions=64, prompt="query: ")
    table, vectors = read(out)
    assert table.column_names == ["doc_id", "embedding"] and table.column("doc_id").to_pylist() == ids
    assert vectors.shape == (len(texts), 64)
    meta = json.loads(table.schema.metadata[b"tessera"])
    assert meta["rows"] == len(texts)
    assert meta["model"]["name"] == "minilm" and meta["model"]["dimension"] == 64
    assert meta["model"]["backend"] == "onnx" and meta["model"]["dtype"] == "float32"
    assert len(meta["model"]["identity"]) == 32
    assert meta["options"]["dimensions"] == 64 and meta["options"]["prompt"] == "query: "
    np.testing.assert_allclose(vectors, reference(settings_for(job_model), texts, dimensions=64, prompt="query: "),
                               atol=2e-5)


@pytest.mark.parametrize("kind, arrow_type, width", [("int8", pa.int8(), 384), ("ubinary", pa.uint8(), 48)])
def test_quantized_output_types(tmp_path, job_model, texts, kind, arrow_type, width):
    source = write_jsonl(tmp_path / "c.jsonl", texts[:50])
    out = tmp_path / "o.parquet"
    run(settings_for(job_model), input=str(source), output=str(out), embedding_type=kind)
    table, vectors = read(out)
    assert table.schema.field("embedding").type == pa.list_(arrow_type, width)
    assert json.loads(table.schema.metadata[b"tessera"])["options"]["embedding_type"] == kind

    async def served():
        async with AsyncModels(settings_for(job_model)) as engine:
            return await engine.embed(texts[:50], embedding_type=kind)

    assert vectors.tobytes() == np.asarray(asyncio.run(served())).tobytes()


def test_a_finished_job_run_again_does_no_model_work(tmp_path, job_model, texts, monkeypatch):
    from core.engine import Registry

    source = write_jsonl(tmp_path / "c.jsonl", texts[:40])
    out = tmp_path / "o.parquet"
    options = {"input": str(source), "output": str(out)}
    run(settings_for(job_model), **options)
    before = out.read_bytes()

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded again")

    monkeypatch.setattr(Registry, "from_settings", classmethod(no_loading))
    again = run(settings_for(job_model), **options)
    assert again.already_complete and again.rows == 40 and out.read_bytes() == before
    with pytest.raises(JobError, match="another job"):  # other options, same output: refused, not mixed
        run(settings_for(job_model), **options, dimensions=32)


def test_a_work_folder_of_other_options_is_not_resumed(tmp_path, job_model, texts):
    source = write_jsonl(tmp_path / "c.jsonl", texts[:20])
    work = tmp_path / "o.parquet.parts"
    work.mkdir()
    (work / "job.json").write_text(json.dumps({"input": "elsewhere"}))
    with pytest.raises(JobError, match="part of another job"):
        run(settings_for(job_model), input=str(source), output=str(tmp_path / "o.parquet"))


def embed_command(source, out, job_model, *extra) -> list[str]:
    return [sys.executable, "-m", "core", "embed", "--input", str(source), "--output", str(out), "--model",
            f"path={job_model['path']},name=minilm,backend=onnx", "--threads", "2", *extra]


def job_env() -> dict:
    return {**environ_without_settings(), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
            "TESSERA_CACHE_DIR": os.environ["TESSERA_CACHE_DIR"], "TESSERA_AUTO_EXPORT": "false"}


def test_sigkill_mid_job_then_the_same_command_resumes_with_every_id_exactly_once(tmp_path, job_model):
    texts = corpus(3000, repeats=300, seed=3)
    ids = [f"row{i}" for i in range(len(texts))]
    source = write_jsonl(tmp_path / "c.jsonl", texts, ids)
    out = tmp_path / "o.parquet"
    command = embed_command(source, out, job_model, "--id-column", "doc_id", "--rows-per-part", "100")
    proc = subprocess.Popen(command, cwd=ROOT, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    parts = tmp_path / "o.parquet.parts"
    deadline = time.monotonic() + 240
    while len(list(parts.glob("part-*.parquet"))) < 3:
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline, "no parts written in time"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not out.exists()
    resumed = subprocess.run(command, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    done_before = int(resumed.stdout.split(" this run, ")[1].split(" done before")[0])
    assert done_before >= 300, resumed.stdout
    table, vectors = read(out)
    assert table.column("doc_id").to_pylist() == ids  # every id once, in input order
    fresh = tmp_path / "fresh.parquet"
    subprocess.run(embed_command(source, fresh, job_model, "--id-column", "doc_id"), cwd=ROOT, env=job_env(),
                   check=True, capture_output=True, timeout=600)
    np.testing.assert_allclose(vectors, read(fresh)[1], atol=2e-5)
    assert not parts.exists()


def test_the_command_prints_progress_lines_and_a_summary_off_a_terminal(tmp_path, job_model, texts):
    source = tmp_path / "c.txt"
    source.write_text("\n".join(texts[:30]) + "\n\n" + texts[0] + "\n")
    out = tmp_path / "o.parquet"
    done = subprocess.run(embed_command(source, out, job_model), cwd=ROOT, env=job_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "starting at row 0" in done.stderr
    assert "rows: 31 (31 this run, 0 done before)" in done.stdout
    distinct = len(set(texts[:30]))
    assert f"unique texts embedded: {distinct}; repeats answered from the job: {31 - distinct}" in done.stdout
    assert "embeddings/s:" in done.stdout
    ids = pq.read_table(out).column("id").to_pylist()
    assert ids == [*range(30), 31]  # line numbers; the blank line 30 has no row
    again = subprocess.run(embed_command(source, out, job_model), cwd=ROOT, env=job_env(), capture_output=True,
                           text=True, timeout=300)
    assert "already complete (31 rows)" in again.stdout


def test_bad_input_is_a_clear_error(tmp_path, job_model):
    source = tmp_path / "c.jsonl"
    source.write_text('{"text": "fine"}\n{"other": 1}\n')
    done = subprocess.run(embed_command(source, tmp_path / "o.parquet", job_model), cwd=ROOT, env=job_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "line 2 has no 'text' field" in done.stderr
    missing = subprocess.run(embed_command(tmp_path / "nope.csv", tmp_path / "o.parquet", job_model), cwd=ROOT,
                             env=job_env(), capture_output=True, text=True, timeout=300)
    assert missing.returncode == 1 and "no such file" in missing.stderr


def test_uris_go_through_pyarrows_filesystems_with_the_work_folder_under_cache_dir(tmp_path, job_model, texts):
    """``file://`` takes the path an ``s3://`` input and output take (pyarrow's FileSystem.from_uri)."""
    source = tmp_path / "c.jsonl.gz"
    import gzip

    with gzip.open(source, "wt") as handle:
        handle.write("".join(json.dumps({"text": t}) + "\n" for t in texts[:30]))
    out = tmp_path / "o.parquet"
    settings = settings_for(job_model, cache_dir=tmp_path / "cache")
    summary = run(settings, input=f"file://{source}", output=f"file://{out}", rows_per_part=10)
    assert summary.rows == 30
    assert pq.read_table(out).column("id").to_pylist() == list(range(30))
    assert (tmp_path / "cache" / "jobs").is_dir() and not any((tmp_path / "cache" / "jobs").iterdir())
    again = run(settings, input=f"file://{source}", output=f"file://{out}", rows_per_part=10)
    assert again.already_complete


@pytest.mark.parametrize("module, extra, runner", [("pyarrow", "bulk", "local"), ("ray", "ray", "ray")])
def test_a_missing_optional_package_names_its_extra(tmp_path, job_model, monkeypatch, module, extra, runner):
    source = tmp_path / "c.txt"
    source.write_text("one\ntwo\n")
    code = ("import sys; sys.modules[%r] = None\n"
            "from core.cli import main\n"
            "raise SystemExit(main(sys.argv[1:]))") % module
    done = subprocess.run([sys.executable, "-c", code, *embed_command(source, tmp_path / "o.parquet", job_model,
                                                                      "--on", runner)[3:]],
                          cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"[{extra}]" in done.stderr and "is not installed" in done.stderr


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "csv", "text"])
def test_reading_from_a_row_skips_earlier_rows_exactly(tmp_path, texts, fmt):
    """What a resumed job and a Ray actor read: the rows from ``skip`` on, with the ids a full read gives them
    (row groups before it not read, lines before it not parsed)."""
    from core.bulk.formats import read_chunks

    source = tmp_path / f"c.{ {'text': 'txt'}.get(fmt, fmt) }"
    if fmt == "parquet":
        pq.write_table(pa.table({"text": texts}), source, row_group_size=17)
    elif fmt == "jsonl":
        write_jsonl(source, texts)
    elif fmt == "csv":
        pacsv.write_csv(pa.table({"text": texts}), source)
    else:
        source.write_text("".join(t + ("\n\n" if i % 5 == 0 else "\n") for i, t in enumerate(texts)))
    full = [(c.start, c.ids, c.texts) for c in read_chunks(str(source), rows=25)]
    rows = [(i, t) for _, ids, ts in full for i, t in zip(ids, ts)]
    assert len(rows) == len(texts)
    for skip in (0, 1, 17, 40, 101, len(texts) - 1, len(texts)):
        chunks = list(read_chunks(str(source), rows=25, skip=skip))
        assert [c.start for c in chunks] == list(range(skip, len(texts), 25))
        assert [(i, t) for c in chunks for i, t in zip(c.ids, c.texts)] == rows[skip:]


def test_on_modal_without_an_account_is_a_clear_error(tmp_path, job_model):
    """``--on modal`` calls the deployed class through Modal's own client: without credentials it stops with
    Modal's reason and what to deploy, before any part."""
    source = tmp_path / "c.txt"
    source.write_text("one\ntwo\n")
    env = {k: v for k, v in job_env().items() if not k.startswith("MODAL_")}
    env["HOME"] = str(tmp_path)  # no ~/.modal.toml
    done = subprocess.run(embed_command(source, tmp_path / "o.parquet", job_model, "--on", "modal"), cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Modal: Token missing" in done.stderr and "modal deploy adapters/modal/app.py" in done.stderr
    assert not (tmp_path / "o.parquet.parts").exists()


def test_chunking_and_normalize_options_reach_the_vectors(tmp_path, job_model, texts):
    from core.bulk.cli import chunking_value

    assert chunking_value("8,2") == {"size": 8, "overlap": 2} and chunking_value("off") is False
    with pytest.raises(JobError, match="SIZE"):
        chunking_value("eight")
    long_texts = [t + " " + t + " " + t for t in texts[:20]]
    source = write_jsonl(tmp_path / "c.jsonl", long_texts)
    out = tmp_path / "o.parquet"
    run(settings_for(job_model), input=str(source), output=str(out), chunking={"size": 8, "overlap": 2},
        normalize=False)
    expected = reference(settings_for(job_model), long_texts, chunking={"size": 8, "overlap": 2}, normalize=False)
    np.testing.assert_allclose(read(out)[1], expected, atol=2e-5)
    assert not np.allclose(np.linalg.norm(expected, axis=1), 1.0)  # not normalized, as asked
    assert not np.allclose(read(out)[1], reference(settings_for(job_model), long_texts, normalize=False), atol=1e-3)
