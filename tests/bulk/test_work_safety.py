"""What the bulk job may touch: only its own files in a work folder it made or found empty, one job at a time
per folder (a lock), never the input (the output may not name it, however spelled), and no cell bigger than
the server's ``max_chars_per_item`` (refused with its row and id before it is hashed or tokenized)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from core.bulk.job import JobOptions, run_local
from core.config import Settings
from core.errors import TesseraError
from tests.bulk.conftest import corpus, write_jsonl
from tests.bulk.test_embed_job import embed_command, job_env
from tests.support.server import ROOT


def settings_for(model: dict, **extra) -> Settings:
    return Settings(models=[model], threads=2, **extra)


def run(settings, **options):
    return asyncio.run(run_local(settings, JobOptions(**options)))


def run_cli(source, out, job_model, *extra, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(embed_command(source, out, job_model, *extra), cwd=ROOT, env={**job_env(), **(env or {})},
                          capture_output=True, text=True, timeout=300)


def assert_refused(done: subprocess.CompletedProcess, *fragments: str) -> None:
    """A one-line error on stderr and exit status 1, no traceback."""
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def parquet_corpus(path: Path, n: int, *, big_row: int | None = None, big_chars: int = 0) -> list[str]:
    texts = corpus(n, seed=7)
    if big_row is not None:
        texts[big_row] = "a" * big_chars
    pq.write_table(pa.table({"text": texts, "doc": [f"d{i}" for i in range(n)]}), path, compression="zstd")
    return texts


# --- 2. the work folder: only the job's own files ------------------------------------------------------


def test_a_given_work_dir_holding_other_files_is_refused_and_left_as_it_was(tmp_path, job_model):
    source = tmp_path / "c.txt"
    source.write_text("one\ntwo\n")
    work = tmp_path / "scratch"
    (work / "mine").mkdir(parents=True)
    (work / "notes.txt").write_text("precious")
    (work / "draft.tmp").write_text("half a thought")
    (work / "mine" / "part-000000000000-000000000002.parquet").write_text("not the job's")
    before = snapshot(work)
    done = run_cli(source, tmp_path / "o.parquet", job_model, "--work-dir", str(work))
    assert_refused(done, f"work folder {work}", "did not write", "notes.txt")
    assert snapshot(work) == before
    assert not (tmp_path / "o.parquet").exists()


def test_an_empty_given_work_dir_is_used_then_kept_empty(tmp_path, job_model):
    source = write_jsonl(tmp_path / "c.jsonl", corpus(30, seed=1))
    work = tmp_path / "scratch"
    work.mkdir()
    summary = run(settings_for(job_model), input=str(source), output=str(tmp_path / "o.parquet"), work_dir=str(work),
                  rows_per_part=10)
    assert summary.rows == 30 and pq.read_table(tmp_path / "o.parquet").num_rows == 30
    assert work.is_dir() and list(work.iterdir()) == []  # the job's files gone, the folder (not the job's) kept


def test_a_work_folder_the_job_made_goes_with_its_files_only(tmp_path, job_model):
    """A job stopped by a bad row leaves its folder; files put there meanwhile (a .tmp too) outlive the job
    that resumes and finishes in it: only the job's own files are deleted, so the folder stays."""
    source = tmp_path / "c.parquet"
    parquet_corpus(source, 200, big_row=150, big_chars=5000)
    out = tmp_path / "o.parquet"
    settings = settings_for(job_model, max_chars_per_item=4000)
    with pytest.raises(TesseraError):
        run(settings, input=str(source), output=str(out), rows_per_part=50)
    work = tmp_path / "o.parquet.parts"
    assert len(list(work.glob("part-*.parquet"))) == 3
    (work / "mine.txt").write_text("kept")
    (work / "mine.tmp").write_text("kept too")
    parquet_corpus(source, 200)  # the row fixed; the same job resumes
    summary = run(settings, input=str(source), output=str(out), rows_per_part=50)
    assert summary.resumed_from == 150 and summary.rows == 200
    assert sorted(p.name for p in work.iterdir()) == ["mine.tmp", "mine.txt"]
    assert (work / "mine.tmp").read_text() == "kept too"


def test_a_finished_job_removes_the_folder_it_made(tmp_path, job_model):
    source = write_jsonl(tmp_path / "c.jsonl", corpus(20, seed=2))
    work = tmp_path / "deep" / "work"
    run(settings_for(job_model), input=str(source), output=str(tmp_path / "o.parquet"), work_dir=str(work))
    assert not work.exists()


# --- 3. the output never replaces the input --------------------------------------------------------------


def _spelling(tmp_path: Path, kind: str) -> tuple[str, str, list[str]]:
    """(input, output, extra flags): the output names the input's file, or the work folder holds one."""
    data = tmp_path / "x"
    data.mkdir()
    source = data / "in.parquet"
    parquet_corpus(source, 20)
    if kind == "same":
        return str(source), str(source), []
    if kind == "dotdot":
        return "in.parquet", "./../x/in.parquet", []
    if kind == "output-symlink":
        (data / "link.parquet").symlink_to(source)
        return str(source), str(data / "link.parquet"), []
    if kind == "input-symlink":
        (data / "link.parquet").symlink_to(source)
        return str(data / "link.parquet"), str(source), []
    if kind == "hardlink":
        os.link(source, data / "hard.parquet")
        return str(data / "hard.parquet"), str(source), []
    if kind == "file-uri":
        return str(source), f"file://{source}", []
    if kind == "output-in-work":
        return str(source), str(tmp_path / "w" / "o.parquet"), ["--work-dir", str(tmp_path / "w")]
    if kind == "input-in-work":
        return str(source), str(tmp_path / "o.parquet"), ["--work-dir", str(data)]
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["same", "dotdot", "output-symlink", "input-symlink", "hardlink", "file-uri",
                                  "output-in-work", "input-in-work"])
def test_an_output_that_would_replace_the_input_is_refused_before_any_model_work(tmp_path, job_model, kind):
    source, out, extra = _spelling(tmp_path, kind)
    corpus_file = tmp_path / "x" / "in.parquet"
    before = corpus_file.read_bytes()
    done = subprocess.run(embed_command(source, out, job_model, "--overwrite", *extra), cwd=tmp_path / "x",
                          env=job_env(), capture_output=True, text=True, timeout=300)
    if kind.endswith("-in-work"):
        assert_refused(done, "lies in the work folder")
    else:
        assert_refused(done, "is the input file", "never replaces the input")
    assert "starting at row" not in done.stderr  # refused before the job began
    assert corpus_file.read_bytes() == before
    assert pq.read_table(corpus_file).column_names == ["text", "doc"]
    assert not (tmp_path / "o.parquet").exists() and not (tmp_path / "w").exists()


def test_ray_and_modal_refuse_it_before_starting_anything(tmp_path, job_model):
    import ray

    from core.bulk.modal_runner import run_modal_job
    from core.bulk.ray_runner import run_ray

    source = tmp_path / "in.parquet"
    parquet_corpus(source, 20)
    before = source.read_bytes()
    options = JobOptions(input=str(source), output=str(tmp_path / "." / "in.parquet"), overwrite=True)
    with pytest.raises(TesseraError, match="never replaces the input"):
        run_ray(settings_for(job_model), options, num_cpus=1)
    assert not ray.is_initialized()

    def no_model_work(*args):
        raise AssertionError("the class was called")

    for job in (options, JobOptions(input="volume://data/in.parquet", output="volume://data//./in.parquet",
                                    overwrite=True)):
        with pytest.raises(TesseraError, match="never replaces the input"):
            run_modal_job(settings_for(job_model, cache_dir=tmp_path / "cache"), job, embed_map=no_model_work,
                          describe=no_model_work, volume_of=no_model_work)
    assert source.read_bytes() == before


def test_batch_transform_collect_never_writes_over_the_corpus(tmp_path):
    from core.bulk.batch_transform import MANIFEST, collect

    source = tmp_path / "in.parquet"
    parquet_corpus(source, 5)
    before = source.read_bytes()
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    manifest = {"format": "tessera-batch-transform/1", "job": {"input": str(source), "text_column": "text",
                                                               "id_column": None},
                "model": {"name": "m", "identity": "i"}, "options": {}, "id_column": "id", "rows": 0, "files": []}
    (prepared / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(TesseraError, match="never replaces the input"):
        collect(Settings(), str(prepared), str(tmp_path / "results"), str(source), overwrite=True)
    assert source.read_bytes() == before


# --- 4. one job at a time per work folder -----------------------------------------------------------------


def test_a_second_job_on_a_running_jobs_work_folder_is_refused_naming_the_folder_and_holder(tmp_path, job_model):
    texts = corpus(600, seed=4)
    ids = [f"r{i}" for i in range(len(texts))]
    source = write_jsonl(tmp_path / "c.jsonl", texts, ids)
    out = tmp_path / "o.parquet"
    command = embed_command(source, out, job_model, "--id-column", "doc_id", "--rows-per-part", "50")
    first = subprocess.Popen(command, cwd=ROOT, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    work = tmp_path / "o.parquet.parts"
    try:
        deadline = time.monotonic() + 240
        while not list(work.glob("part-*.parquet")):
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "no part written in time"
            time.sleep(0.05)
        first.send_signal(signal.SIGSTOP)  # the first job holds its folder, doing nothing, while the second starts
        try:
            second = subprocess.run(command, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=300)
        finally:
            first.send_signal(signal.SIGCONT)
        assert_refused(second, f"work folder {work}", "another job is running in it", f"PID {first.pid}")
        stdout, stderr = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(timeout=30)
    assert first.returncode == 0, stderr
    assert pq.read_table(out).column("doc_id").to_pylist() == ids  # the first job's output, whole
    assert not work.exists()


def test_a_killed_jobs_lock_does_not_hold_the_folder(tmp_path, job_model):
    """flock dies with its holder: after SIGKILL the same command resumes (the lock file is still there)."""
    texts = corpus(400, seed=6)
    source = write_jsonl(tmp_path / "c.jsonl", texts)
    out = tmp_path / "o.parquet"
    command = embed_command(source, out, job_model, "--rows-per-part", "50")
    first = subprocess.Popen(command, cwd=ROOT, env=job_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    work = tmp_path / "o.parquet.parts"
    deadline = time.monotonic() + 240
    while not list(work.glob("part-*.parquet")):
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    first.kill()
    first.wait(timeout=30)
    assert (work / "tessera-work.lock").read_text() == str(first.pid)
    done = subprocess.run(command, cwd=ROOT, env=job_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert pq.read_table(out).column("id").to_pylist() == list(range(len(texts)))


# --- 11. a cell over max_chars_per_item -------------------------------------------------------------------


def test_a_cell_over_max_chars_per_item_is_refused_naming_its_row_and_id(tmp_path, job_model):
    source = tmp_path / "c.parquet"
    parquet_corpus(source, 100, big_row=70, big_chars=3_000_000)
    done = run_cli(source, tmp_path / "o.parquet", job_model, "--id-column", "doc",
                   env={"TESSERA_MAX_CHARS_PER_ITEM": "1000000"})
    assert_refused(done, "row 70 (id 'd70')", "3000000 characters", "max_chars_per_item is 1000000")


def test_the_prompt_counts_toward_each_rows_characters(tmp_path, job_model):
    source = write_jsonl(tmp_path / "c.jsonl", ["short", "b" * 95, "fine"], ids=["a", "b", "c"])
    with pytest.raises(TesseraError, match=r"row 1 \(id 'b'\): the text has 95 characters; max_chars_per_item is "
                                           r"100, less the 8-character --prompt"):
        run(settings_for(job_model, max_chars_per_item=100), input=str(source), output=str(tmp_path / "o.parquet"),
            id_column="doc_id", prompt="query: >")


def test_a_text_over_the_models_length_names_its_row_not_its_place_in_a_request(tmp_path, job_model):
    """--no-truncate: the engine refuses the text; the error names the input's row and id."""
    source = tmp_path / "c.parquet"
    texts = corpus(100, seed=8)
    texts[70] = "word " * 1000
    pq.write_table(pa.table({"text": texts, "doc": [f"d{i}" for i in range(100)]}), source)
    with pytest.raises(TesseraError, match=r"^row 70 \(id 'd70'\) has 1002 tokens"):
        run(settings_for(job_model), input=str(source), output=str(tmp_path / "o.parquet"), id_column="doc",
            truncate=False)


@pytest.mark.parametrize("fmt", ["parquet", "csv", "text", "jsonl"])
def test_a_giant_cell_is_measured_before_it_becomes_a_python_string(tmp_path, fmt):
    """20 MB in one cell (1 MB in CSV, within a record block) against a limit of 100,000 characters, among
    rows whose row group could hold it: refused with the row and id; Parquet, CSV (measured in Arrow) and text
    lines (read in bounded pieces) allocate no Python string of its size."""
    from core.bulk.formats import TextLimit, read_chunks

    big = 1_000_000 if fmt == "csv" else 20_000_000
    texts = [f"row {i}" for i in range(100)]
    texts[6] = "z" * big
    source = tmp_path / f"c.{ {'text': 'txt'}.get(fmt, fmt) }"
    if fmt == "parquet":
        pq.write_table(pa.table({"text": texts}), source, compression="zstd")
    elif fmt == "csv":
        pacsv.write_csv(pa.table({"text": texts}), source)
    elif fmt == "jsonl":
        write_jsonl(source, texts)
    else:
        source.write_text("\n".join(texts[:3]) + "\n\n" + "\n".join(texts[3:]) + "\n")
    limit = TextLimit(100_000, "max_chars_per_item is 100000")
    tracemalloc.start()
    try:
        with pytest.raises(TesseraError) as caught:
            for _ in read_chunks(str(source), rows=16, limit=limit):
                pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    row_id = 7 if fmt == "text" else 6  # a text file's id is its line number (line 3 is blank)
    assert caught.value.message == f"row 6 (id {row_id}): the text has {big} characters; max_chars_per_item is 100000"
    if fmt != "jsonl":  # a JSON line is parsed whole to find its field
        assert peak < big // 4, peak


def test_a_csv_record_bigger_than_any_text_within_the_limit_is_a_clear_error(tmp_path):
    from core.bulk.formats import TextLimit, read_chunks

    source = tmp_path / "c.csv"
    pacsv.write_csv(pa.table({"text": ["fine", "z" * 20_000_000, "fine"]}), source)
    with pytest.raises(TesseraError, match=r"a CSV record holds more than \d+ bytes.*max_chars_per_item is 1000"):
        list(read_chunks(str(source), limit=TextLimit(1000, "max_chars_per_item is 1000")))


FOOTER_CHECK = """
import sys
import pyarrow as pa
from core.bulk.formats import TextLimit, read_chunks
from core.errors import TooLarge

try:
    list(read_chunks(sys.argv[1], id_column="doc", limit=TextLimit(1000, "max_chars_per_item is 1000")))
except TooLarge as exc:
    print(exc.message)
print(pa.default_memory_pool().max_memory())
"""


def test_a_row_group_too_big_for_its_rows_is_refused_from_the_footer_without_decoding_it(tmp_path):
    """The 1 GB cell of a 34 KB file, scaled down: 3 MB in one of 100 rows against a limit of 1000 characters
    is more than the group's 100 rows can hold within it, so it is refused before a page is decoded (pyarrow's
    pool never holds the cell)."""
    source = tmp_path / "c.parquet"
    parquet_corpus(source, 100, big_row=70, big_chars=3_000_000)
    done = subprocess.run([sys.executable, "-c", FOOTER_CHECK, str(source)], cwd=ROOT, env=job_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    message, peak = done.stdout.strip().splitlines()
    assert message.startswith("rows 0 to 99 (ids 'd0' to 'd99'): a text over the limit"), message
    assert message.endswith("max_chars_per_item is 1000"), message
    assert int(peak) < 1_000_000, peak
