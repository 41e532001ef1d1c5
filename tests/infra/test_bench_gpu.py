"""scripts/bench_gpu.py, the parts that run without a GPU: the docs/benchmarks.md section merge
(benchmarks.docs_section, pure; the script's --merge) and the detection of a missing ONNX Runtime CUDA
provider (benchmarks.gpu). Nothing here starts a server or needs CUDA."""

from __future__ import annotations

import pytest

from benchmarks.docs_section import END_MARKER as END, START_MARKER as START, replace_section
from benchmarks.gpu import spec_for
from tests.infra.conftest import ROOT
from tests.support.modules import load_script

bench_gpu = load_script("bench_gpu")

DOC = f"# Benchmarks\n\nCPU figures.\n\n{START}\n## GPU (prepared, not yet run)\n\nplaceholder\n{END}\n\ntail\n"


def test_merge_replaces_only_the_section():
    merged = replace_section(DOC, "## GPU: NVIDIA H200\n\n| a |\n|---|\n| 1 |\n")
    head, rest = merged.split(START)
    inner, tail = rest.split(END)
    assert head == "# Benchmarks\n\nCPU figures.\n\n"
    assert tail == "\n\ntail\n"
    assert inner == "\n## GPU: NVIDIA H200\n\n| a |\n|---|\n| 1 |\n"
    assert "placeholder" not in merged
    # merging the same section again changes nothing
    assert replace_section(merged, "## GPU: NVIDIA H200\n\n| a |\n|---|\n| 1 |\n") == merged


def test_merge_takes_the_inside_of_a_file_with_markers():
    section = f"ignored before\n{START}\nnew figures\n{END}\nignored after\n"
    merged = replace_section(DOC, section)
    assert f"{START}\nnew figures\n{END}" in merged
    assert "ignored" not in merged
    assert merged.count(START) == 1 and merged.count(END) == 1


@pytest.mark.parametrize("doc", [
    "# no markers\n",
    f"{START}\nonly a start\n",
    f"{END}\n{START}\nreversed\n",
    f"{START}\n{END}\n{START}\n{END}\n",
])
def test_merge_refuses_a_doc_without_one_ordered_pair(doc):
    with pytest.raises(ValueError):
        replace_section(doc, "x")


def test_merge_writes_the_doc_file(tmp_path):
    doc, section = tmp_path / "benchmarks.md", tmp_path / "benchmarks-gpu.md"
    doc.write_text(DOC)
    section.write_text("## GPU: measured\n")
    assert bench_gpu.main(["--merge", str(section), "--doc", str(doc)]) == 0
    assert doc.read_text() == DOC.replace("## GPU (prepared, not yet run)\n\nplaceholder", "## GPU: measured")


def test_docs_benchmarks_has_the_section_markers_once():
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert text.count(START) == 1 and text.count(END) == 1
    assert text.index(START) < text.index(END)


def test_onnx_cuda_without_the_cuda_provider_is_reported_not_run(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider: the bench would run it")
    spec, why = spec_for("onnx", tmp_path, "cuda", "float16")
    assert spec is None
    assert why.startswith("not run: onnxruntime-gpu is not installed on this machine")
    assert "CPUExecutionProvider" in why
