"""scripts/package_model.py: the tarball has the layout adapters/sagemaker/models.py reads, the
extracted tarball serves embeddings, and the upload is the one S3 call we expect (botocore Stubber)."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import pytest
from botocore.stub import ANY, Stubber

from tests.support.modules import load_script

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json",
                   "modules.json", "sentence_bert_config.json")


@pytest.fixture(scope="module")
def package():
    return load_script("package_model")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, minilm_dir) -> Path:
    """A 1-layer BERT (random weights) with MiniLM's tokenizer and pooling, plus artifact folders."""
    from transformers import BertConfig, BertModel

    folder = tmp_path_factory.mktemp("models") / "tiny-bert"
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=128)
    BertModel(config).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir / name, folder / name)
    shutil.copytree(minilm_dir / "1_Pooling", folder / "1_Pooling")
    # artifact folders travel as they are (contents are the exporters' business, not the packager's)
    for sub, name in (("onnx", "model.onnx"), ("ct2", "model.bin"), ("neuron", "manifest.json")):
        (folder / sub).mkdir()
        (folder / sub / name).write_bytes(b"artifact " + sub.encode())
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "x.pyc").write_bytes(b"junk")
    return folder


def test_tarball_layout(package, tiny_model, tmp_path):
    tarball = package.build_tarball([tiny_model], tmp_path / "model.tar.gz", name="mini")
    with tarfile.open(tarball) as tar:
        names = set(tar.getnames())
        owners = {(m.uid, m.gid) for m in tar.getmembers()}
    assert {"mini/config.json", "mini/model.safetensors", "mini/tokenizer.json", "mini/1_Pooling/config.json",
            "mini/onnx/model.onnx", "mini/ct2/model.bin", "mini/neuron/manifest.json"} <= names
    assert not any("__pycache__" in n for n in names)
    assert all(n == "mini" or n.startswith("mini/") for n in names)
    assert owners == {(0, 0)}


def test_extracted_tarball_serves_through_the_sagemaker_loader(package, tiny_model, tmp_path):
    """Package with a tessera.yaml, unpack as SageMaker does, read it with models.py, serve embeddings."""
    from fastapi.testclient import TestClient

    from adapters.sagemaker.models import sagemaker_settings
    from core.api.app import create_app
    from core.engine import Registry

    config = tmp_path / "tessera.yaml"
    config.write_text("models:\n  - {path: mini, name: mini, backend: torch}\n")
    tarball = package.build_tarball([tiny_model], tmp_path / "model.tar.gz", name="mini", config=config)
    model_dir = tmp_path / "opt-ml-model"
    with tarfile.open(tarball) as tar:
        tar.extractall(model_dir, filter="data")
    settings = sagemaker_settings({"SM_MODEL_DIR": str(model_dir)})
    assert [(s.served_name, s.path) for s in settings.models] == [("mini", model_dir / "mini")]
    registry = Registry.from_settings(settings)
    with TestClient(create_app(settings, registry=registry)) as client:
        response = client.post("/v1/embeddings", json={"model": "mini", "input": ["hello world", "packaged"]})
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert len(data) == 2 and len(data[0]["embedding"]) == 32


def test_discovery_without_a_config(package, tiny_model, tmp_path):
    """No tessera.yaml: models.py finds one model per top-level folder, named after it."""
    from adapters.sagemaker.models import sagemaker_settings

    tarball = package.build_tarball([tiny_model], tmp_path / "model.tar.gz")
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp_path / "m", filter="data")
    specs = sagemaker_settings({"SM_MODEL_DIR": str(tmp_path / "m")}).models
    assert [s.served_name for s in specs] == ["tiny-bert"]


def test_bad_inputs_are_refused(package, tiny_model, tmp_path):
    with pytest.raises(ValueError, match="not a model folder"):
        package.build_tarball([tmp_path], tmp_path / "x.tar.gz")
    with pytest.raises(ValueError, match="single model"):
        package.build_tarball([tiny_model, tiny_model], tmp_path / "x.tar.gz", name="a")
    with pytest.raises(ValueError, match="share a name"):
        package.build_tarball([tiny_model, tiny_model], tmp_path / "x.tar.gz")
    with pytest.raises(ValueError, match="must be named"):
        package.build_tarball([tiny_model], tmp_path / "x.tar.gz", config=tmp_path / "settings.yaml")
    assert package.split_s3_url("s3://bucket/tessera/minilm/") == ("bucket", "tessera/minilm/model.tar.gz")
    assert package.split_s3_url("s3://bucket") == ("bucket", "model.tar.gz")
    assert package.split_s3_url("s3://bucket/a/custom.tar.gz") == ("bucket", "a/custom.tar.gz")
    with pytest.raises(ValueError):
        package.split_s3_url("https://bucket/x")


def consume_bodies(client) -> list[int]:
    """Stand in for the HTTP layer's read of each request body. Stubber answers before a request is
    created or sent, so nothing would read it; here each body is switched to "transferring" (what
    s3transfer does when the request is created) and read, which is what drives the progress callbacks."""
    sizes: list[int] = []

    def read(params, **_):
        body = params.get("Body")
        if hasattr(body, "signal_transferring"):
            body.signal_transferring()
            sizes.append(len(body.read()))

    client.meta.events.register("before-parameter-build.s3.*", read)
    return sizes


def test_upload_small_file_is_one_put_object_with_progress(package, tiny_model, tmp_path, fake_aws):
    import boto3

    tarball = package.build_tarball([tiny_model], tmp_path / "model.tar.gz")
    size = tarball.stat().st_size
    client = boto3.client("s3", region_name="us-east-1")
    out = io.StringIO()
    progress = package.Progress(size, out=out, label="up")
    with Stubber(client) as stub:
        sizes = consume_bodies(client)  # after the Stubber: first in line, before its answer
        stub.add_response("put_object", {"ETag": '"abc"'},
                          {"Bucket": "my-models", "Key": "tessera/model.tar.gz", "Body": ANY,
                           "ChecksumAlgorithm": ANY})
        url = package.upload(client, tarball, "my-models", "tessera/model.tar.gz", callback=progress)
        stub.assert_no_pending_responses()
    assert url == "s3://my-models/tessera/model.tar.gz"
    assert sizes == [size] and progress.seen == size
    assert out.getvalue().rstrip().endswith(f"100% ({size / 1e6:.1f}/{size / 1e6:.1f} MB)")


def test_upload_large_file_is_multipart_with_progress(package, tmp_path, fake_aws):
    """Above the threshold: create, one upload_part per 5 MB chunk (in order, one thread), complete."""
    import os

    import boto3
    from boto3.s3.transfer import TransferConfig

    big = tmp_path / "model.tar.gz"
    big.write_bytes(os.urandom(11 * 1024 * 1024))
    mb5 = 5 * 1024 * 1024
    client = boto3.client("s3", region_name="us-east-1")
    out = io.StringIO()
    progress = package.Progress(big.stat().st_size, out=out, label="up")
    config = TransferConfig(multipart_threshold=mb5, multipart_chunksize=mb5, max_concurrency=1, use_threads=False)
    where = {"Bucket": "my-models", "Key": "t/model.tar.gz"}
    with Stubber(client) as stub:
        sizes = consume_bodies(client)
        stub.add_response("create_multipart_upload", {**where, "UploadId": "u1"}, {**where, "ChecksumAlgorithm": ANY})
        for number in (1, 2, 3):
            stub.add_response("upload_part", {"ETag": f'"e{number}"'},
                              {**where, "UploadId": "u1", "PartNumber": number, "Body": ANY,
                               "ChecksumAlgorithm": ANY})
        stub.add_response("complete_multipart_upload", {**where, "ETag": '"all"'},
                          {**where, "UploadId": "u1", "MultipartUpload": {"Parts": [
                              {"ETag": f'"e{n}"', "PartNumber": n} for n in (1, 2, 3)]}})
        package.upload(client, big, "my-models", "t/model.tar.gz", callback=progress, config=config)
        stub.assert_no_pending_responses()
    assert sizes == [mb5, mb5, 1024 * 1024]
    assert progress.seen == big.stat().st_size
    shown = [p for p in out.getvalue().split("\r") if p]
    assert len(shown) >= 3 and shown[-1].startswith("up: 100%")


def test_cli_dry_run_prints_the_call(package, tiny_model, tmp_path, fake_aws):
    out = io.StringIO()
    target = tmp_path / "out" / "model.tar.gz"
    assert package.main([str(tiny_model), "--output", str(target), "--s3", "s3://my-models/tessera/",
                         "--dry-run"], out=out) == 0
    lines = out.getvalue().splitlines()
    size = sum(p.stat().st_size for p in tiny_model.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    files = sum(1 for p in tiny_model.rglob("*") if not p.is_dir() and "__pycache__" not in p.parts)
    assert lines[0] == f"would write {target} ({files} files, {size / 1e6:.1f} MB before compression)"
    assert lines[1] == f"s3.upload_file(Filename={str(target)!r}, Bucket='my-models', Key='tessera/model.tar.gz')"
    # a dry run writes nothing: no tarball, not even its folder
    assert not target.exists() and not target.parent.exists()


def test_cli_packs_with_progress(package, tiny_model, tmp_path, capsys):
    target = tmp_path / "model.tar.gz"
    assert package.main([str(tiny_model), "--output", str(target)], out=io.StringIO()) == 0
    err = capsys.readouterr().err
    assert f"packing {target}: 100%" in err and err.count("%") >= 2
    with tarfile.open(target) as tar:
        names = tar.getnames()
    assert "tiny-bert/onnx/model.onnx" in names and not any("__pycache__" in n for n in names)


def test_build_outputs_are_git_ignored(tmp_path):
    import subprocess

    from .conftest import ROOT

    for path in ("model.tar.gz", "models/model.tar.gz"):
        done = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, timeout=30)
        assert done.returncode == 0, f"{path} is not ignored by .gitignore"
