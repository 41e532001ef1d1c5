"""scripts/build_images.py --dry-run: the docker commands for the four images (no daemon here)."""

from __future__ import annotations

import io
import shlex
import subprocess
import sys

import pytest

from tests.support.modules import load_script

from .conftest import ROOT


@pytest.fixture(scope="module")
def build():
    return load_script("build_images")


def commands(text: str) -> list[list[str]]:
    prefix = f"(cd {shlex.quote(str(ROOT))} && "
    lines = text.splitlines()
    assert all(line.startswith(prefix) and line.endswith(")") for line in lines)
    return [shlex.split(line[len(prefix):-1]) for line in lines]


def test_dry_run_all_images_with_push(build):
    out = io.StringIO()
    assert build.main(["--dry-run", "--registry", "123456789012.dkr.ecr.us-east-1.amazonaws.com", "--version", "v3",
                       "--push", "--neuron-base-image", "dlc/pytorch-inference-neuronx:2.5-py311"], out=out) == 0
    registry = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    pushed = "push=true,oci-mediatypes=false"  # BuildKit pushes Docker V2 media types itself
    assert commands(out.getvalue()) == [
        ["docker", "buildx", "build", "--platform", "linux/arm64", "-f", "adapters/lambda/Dockerfile",
         "--provenance=false", "--build-arg", "ARCH=arm64",
         "--output", f"type=image,name={registry}/tessera-lambda:arm64-v3,{pushed}", "."],
        ["docker", "buildx", "build", "--platform", "linux/amd64", "-f", "adapters/lambda/Dockerfile",
         "--provenance=false", "--build-arg", "ARCH=x86_64",
         "--output", f"type=image,name={registry}/tessera-lambda:x86_64-v3,{pushed}", "."],
        ["docker", "buildx", "build", "--platform", "linux/amd64", "-f", "adapters/sagemaker/Dockerfile.cuda",
         "--provenance=false", "--output", f"type=image,name={registry}/tessera-sagemaker:cuda-v3,{pushed}", "."],
        ["docker", "buildx", "build", "--platform", "linux/amd64", "-f", "adapters/sagemaker/Dockerfile.neuron",
         "--provenance=false", "--build-arg", "BASE_IMAGE=dlc/pytorch-inference-neuronx:2.5-py311",
         "--output", f"type=image,name={registry}/tessera-sagemaker:neuron-v3,{pushed}", "."],
    ]


def test_dockerfiles_exist_and_take_the_build_args(build):
    for image in build.IMAGES.values():
        dockerfile = (ROOT / image.dockerfile).read_text()
        for arg in image.build_args:
            assert f"ARG {arg}" in dockerfile
    assert "ARG BASE_IMAGE" in (ROOT / "adapters/sagemaker/Dockerfile.neuron").read_text()


def test_only_and_refusals(build, capsys):
    out = io.StringIO()
    assert build.main(["--dry-run", "--only", "lambda-x86_64"], out=out) == 0
    assert [c[-3] for c in commands(out.getvalue())] == ["tessera-lambda:x86_64"]
    for argv, message in ((["--dry-run", "--only", "sagemaker-neuron"], "needs --neuron-base-image"),
                          (["--dry-run", "--only", "lambda-arm64", "--push"], "--push needs --registry"),
                          (["--dry-run", "--only", "gpu"], "unknown image")):
        with pytest.raises(SystemExit):
            build.main(argv, out=io.StringIO())
        assert message in capsys.readouterr().err


def test_runs_as_a_script():
    done = subprocess.run([sys.executable, str(ROOT / "scripts/build_images.py"), "--dry-run", "--only",
                           "sagemaker-cuda"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("docker buildx build") == 1


def test_lambda_image_export_step_parses():
    """The Lambda image's export step (a shell line inside a RUN) calls scripts/export_onnx.py with
    arguments its parser accepts and asks for the int8 graph the handler serves."""
    text = (ROOT / "adapters/lambda/Dockerfile").read_text()
    line = next(ln for ln in text.splitlines() if "python scripts/export_onnx.py" in ln)
    words = shlex.split(line.split("python scripts/export_onnx.py", 1)[1].rstrip("\\"))
    args = load_script("export_onnx").parse_args(words)
    assert args.int8 == ["fast"] and str(args.out_dir) == "/export/model" and not args.optimize


def test_dry_run_without_arguments_builds_what_needs_none(build, capsys):
    """Default: every image that needs no extra argument; the Neuron one is skipped with what it needs."""
    out = io.StringIO()
    assert build.main(["--dry-run"], out=out) == 0
    built = [c[c.index("-t") + 1] for c in commands(out.getvalue())]
    assert built == ["tessera-lambda:arm64", "tessera-lambda:x86_64", "tessera-sagemaker:cuda"]
    err = capsys.readouterr().err
    assert "skipped sagemaker-neuron: it needs --neuron-base-image" in err


def test_every_image_is_built_without_provenance(build):
    """SageMaker CreateModel takes Docker v2 manifests, Lambda rejects image indexes: no attestation."""
    out = io.StringIO()
    assert build.main(["--dry-run", "--neuron-base-image", "dlc:py311"], out=out) == 0
    lines = commands(out.getvalue())
    assert len(lines) == 4 and all("--provenance=false" in c for c in lines)


def test_lambda_managed_instances_variant_is_python_313(build):
    """Lambda Managed Instances (the runtime client's multi-concurrency mode, AWS_LAMBDA_MAX_CONCURRENCY) run
    Python 3.13 and later only (AWS, "Lambda Managed Instances runtimes": "Python: Python 3.13 and later");
    the default images are 3.12. The py313 variants build the same Dockerfile on the python:3.13 base image,
    only when asked for."""
    out = io.StringIO()
    assert build.main(["--dry-run", "--only", "lambda-py313-arm64,lambda-py313-x86_64"], out=out) == 0
    lines = commands(out.getvalue())
    assert [c[c.index("-t") + 1] for c in lines] == ["tessera-lambda:py313-arm64", "tessera-lambda:py313-x86_64"]
    for command in lines:
        args = dict(a.split("=", 1) for a in command[command.index("-f"):] if "=" in a and not a.startswith("-"))
        assert args["PYTHON_VERSION"] == "3.13" and "--provenance=false" in command
    dockerfile = (ROOT / "adapters/lambda/Dockerfile").read_text()
    assert "FROM public.ecr.aws/lambda/python:${PYTHON_VERSION}-${ARCH}" in dockerfile
    default = io.StringIO()
    assert build.main(["--dry-run"], out=default) == 0
    assert "py313" not in default.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["aarch64", "x86_64"])
def test_lambda_requirements_resolve_for_python_313(arch, tmp_path):
    """What the py313 image's `pip install -r requirements.txt` installs exists as cp313 wheels for Amazon
    Linux 2023 (manylinux, glibc 2.34): pip's resolver, asked for binaries only, from the package index."""
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed", "--target",
         str(tmp_path / "t"), "--python-version", "3.13", "--implementation", "cp", "--only-binary=:all:",
         "--platform", f"manylinux_2_28_{arch}", "--platform", f"manylinux2014_{arch}",
         "-r", str(ROOT / "adapters/lambda/requirements.txt"), "--report", str(report)],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    import json

    installed = {i["metadata"]["name"].lower().replace("_", "-"): i["download_info"]["url"].rsplit("/", 1)[1]
                 for i in json.loads(report.read_text())["install"]}
    assert "cp313" in installed["onnxruntime"] and "cp313" in installed["numpy"]
