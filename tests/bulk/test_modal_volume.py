"""``--on modal`` with ``volume://NAME/PATH`` input and output (core/bulk/modal_volume.py).

Not run against Modal: this machine has no Modal account. The Volume is a folder here, behind an object with
the calls the job makes on ``modal.Volume.from_name(NAME)`` (``listdir``, ``read_file``,
``batch_upload().put_file``), answering as the installed client documents them (``modal.volume.FileEntry``
entries, ``modal.exception.NotFoundError`` for a missing path, no overwrite without ``force``). The model work
goes through the functions the class's methods call (``AsyncModels.embed`` for ``embed_shard``,
``describe_engine`` for ``describe_model``) in this process."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from core.bulk.job import JobError, JobOptions, run_local
from core.bulk.modal_runner import describe_engine, run_modal_job
from core.bulk.modal_volume import VolumePath, local_copy, parse
from core.config import Settings
from tests.bulk.conftest import corpus, write_jsonl
from tests.support.server import ROOT


class FolderVolume:
    """A Modal Volume stood for by a folder: the client calls the job makes, with the client's types."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.reads: list[str] = []
        self.uploads: list[tuple[str, str]] = []

    def _file(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def listdir(self, path: str, *, recursive: bool = False):
        import modal.exception
        from modal.volume import FileEntry, FileEntryType

        target = self._file(path)
        if not target.exists():
            raise modal.exception.NotFoundError(f"No such file or directory: {path}")
        stat = target.stat()
        return [FileEntry(path=path.lstrip("/"), type=FileEntryType.FILE, mtime=int(stat.st_mtime), size=stat.st_size)]

    def read_file(self, path: str):
        self.reads.append(path)
        with open(self._file(path), "rb") as handle:
            while block := handle.read(1 << 16):
                yield block

    @contextlib.contextmanager
    def batch_upload(self, force: bool = False):
        volume = self

        class Batch:
            def put_file(self, local_file, remote_path):
                target = volume._file(str(remote_path))
                if target.exists() and not force:
                    raise FileExistsError(remote_path)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(local_file, target)
                volume.uploads.append((str(local_file), str(remote_path)))

        yield Batch()


@pytest.fixture
def in_process_class(job_model):
    """``embed_map`` / ``describe`` as ``run_modal`` gets them from the class, run here on the job's model."""
    from core.engine import Registry
    from core.inprocess import AsyncModels

    settings = Settings(models=[job_model], threads=2)
    registry = Registry.from_settings(settings)
    loop = asyncio.new_event_loop()
    calls: list[int] = []

    def embed_map(shards, kwargs):
        for shard in shards:
            calls.append(len(shard))
            yield loop.run_until_complete(AsyncModels(settings, registry).embed(shard, None, **kwargs))

    def describe():
        return loop.run_until_complete(describe_engine(settings, registry, None))

    yield embed_map, describe, calls
    loop.run_until_complete(registry.stop())
    loop.close()


@pytest.mark.parametrize("uri, parsed", [
    ("volume://data/corpus.parquet", VolumePath("data", "/corpus.parquet")),
    ("volume://my-data_1.x/a/b/c.jsonl", VolumePath("my-data_1.x", "/a/b/c.jsonl")),
])
def test_volume_uris_name_the_volume_and_the_file(uri, parsed):
    assert parse(uri, "--input") == parsed and str(parsed) == uri
    assert local_copy("/cache", parsed) == Path("/cache/volumes") / parsed.name / parsed.path.lstrip("/")


@pytest.mark.parametrize("uri", ["volume://", "volume://data", "volume://data/", "volume:///corpus.jsonl",
                                 "volume://data/folder/", "volume://data/../etc/passwd", "volume://da ta/c.jsonl"])
def test_a_malformed_volume_uri_is_a_clear_error(uri):
    with pytest.raises(JobError, match=r"--output .*expected volume://NAME/PATH"):
        parse(uri, "--output")


def test_the_job_reads_and_writes_files_on_volumes_and_resumes(tmp_path, job_model, in_process_class):
    """Input on one Volume, output on another: the same ids and vectors as the local job of the same corpus,
    the Volume URIs in the metadata; interrupted, the same call resumes without fetching the input again;
    run again once finished, no model work and no upload."""
    embed_map, describe, calls = in_process_class
    data, results = FolderVolume(tmp_path / "vol-data"), FolderVolume(tmp_path / "vol-results")
    volumes = {"data": data, "results": results}
    texts = corpus(120, repeats=20)
    (tmp_path / "vol-data" / "in").mkdir(parents=True)
    write_jsonl(tmp_path / "vol-data" / "in" / "corpus.jsonl", texts)
    settings = Settings(models=[job_model], threads=2, cache_dir=str(tmp_path / "cache"))
    options = JobOptions(input="volume://data/in/corpus.jsonl", output="volume://results/out/vectors.parquet",
                         rows_per_part=30)
    windows = []

    def failing_map(shards, kwargs):  # the connection is lost in the third window (of 30 rows)
        windows.append(len(shards))
        if len(windows) == 3:
            raise RuntimeError("connection lost")
        yield from embed_map(shards, kwargs)

    with pytest.raises(RuntimeError, match="connection lost"):
        run_modal_job(settings, options, failing_map, describe, shard_size=16, window=1, volume_of=volumes.__getitem__)
    assert data.reads == ["/in/corpus.jsonl"] and results.uploads == []
    summary = run_modal_job(settings, options, embed_map, describe, shard_size=16, window=2,
                            volume_of=volumes.__getitem__)
    assert summary.resumed_from == 60 and summary.rows == 120 and summary.output == options.output
    assert data.reads == ["/in/corpus.jsonl"]  # fetched once over both runs
    assert sum(calls) == 100  # each distinct text embedded once
    assert [remote for _, remote in results.uploads] == ["/out/vectors.parquet"]
    on_volume = tmp_path / "vol-results" / "out" / "vectors.parquet"
    table = pq.read_table(on_volume)
    meta = __import__("json").loads(table.schema.metadata[b"tessera"])
    assert meta["job"]["input"] == "volume://data/in/corpus.jsonl" and meta["rows"] == 120
    local = tmp_path / "local.parquet"
    asyncio.run(run_local(Settings(models=[job_model], threads=2),
                          JobOptions(input=str(tmp_path / "vol-data" / "in" / "corpus.jsonl"), output=str(local))))
    expected = pq.read_table(local)
    assert table.column("id").to_pylist() == expected.column("id").to_pylist() == list(range(120))
    got, want = (np.asarray(t.column("embedding").combine_chunks().flatten()).reshape(120, -1)
                 for t in (table, expected))
    np.testing.assert_allclose(got, want, atol=1e-5)

    again = run_modal_job(settings, options, embed_map, describe, volume_of=volumes.__getitem__)
    assert again.already_complete and sum(calls) == 100 and len(results.uploads) == 1
    on_volume.unlink()  # the Volume lost it: the finished local copy is uploaded again, no model work
    run_modal_job(settings, options, embed_map, describe, volume_of=volumes.__getitem__)
    assert on_volume.exists() and sum(calls) == 100 and len(results.uploads) == 2


def test_a_missing_input_on_the_volume_is_a_clear_error(tmp_path, job_model, in_process_class):
    embed_map, describe, _ = in_process_class
    settings = Settings(models=[job_model], threads=2, cache_dir=str(tmp_path / "cache"))
    options = JobOptions(input="volume://data/nothing.jsonl", output=str(tmp_path / "o.parquet"))
    with pytest.raises(JobError, match=r"--input volume://data/nothing.jsonl: no such file on the Volume 'data'"):
        run_modal_job(settings, options, embed_map, describe, volume_of=lambda name: FolderVolume(tmp_path / name))
    assert not (tmp_path / "o.parquet.parts").exists()


@pytest.mark.parametrize("runner", ["local", "ray"])
def test_volume_uris_off_modal_are_refused_with_what_to_do(tmp_path, job_model, runner):
    from tests.bulk.test_embed_job import embed_command, job_env

    source = tmp_path / "c.txt"
    source.write_text("one\ntwo\n")
    done = subprocess.run(embed_command(source, "volume://results/o.parquet", job_model, "--on", runner), cwd=ROOT,
                          env=job_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (f"--output volume://results/o.parquet: a Modal Volume is read and written by --on modal; with --on "
            f"{runner}, copy the file with `modal volume get` / `modal volume put`") in done.stderr
