#!/usr/bin/env python
"""Build (and optionally push) the Tessera images: Lambda arm64 / x86_64, SageMaker CUDA and Neuron.

    python scripts/build_images.py [--only lambda-arm64,lambda-x86_64,sagemaker-cuda,sagemaker-neuron,
                                           lambda-py313-arm64,lambda-py313-x86_64]
        [--registry ACCOUNT.dkr.ecr.REGION.amazonaws.com] [--version v1] [--push]
        [--neuron-base-image <pytorch-inference-neuronx DLC>] [--dry-run]

Run from anywhere; the build context is the repository root. Each image is tagged
``[REGISTRY/]REPOSITORY:TAG`` where TAG is the variant (arm64, x86_64, cuda, neuron), with
``-VERSION`` appended when --version is given. ``--dry-run`` prints the docker commands only.
By default every image is built that needs no extra argument; sagemaker-neuron needs
``--neuron-base-image`` and is skipped (saying so) without it, unless named in ``--only``. The Python 3.13
Lambda images (``lambda-py313-*``, tags ``py313-arm64`` / ``py313-x86_64``) are the variant for Lambda
Managed Instances, which run Python 3.13 and later only; they are built only when named in ``--only``.
``--push`` needs ``docker login`` to the registry first:
``aws ecr get-login-password | docker login --username AWS --password-stdin REGISTRY``.
Every image is built with ``--provenance=false``: BuildKit's provenance attestation turns the image
into an OCI image index, which Lambda rejects and SageMaker ``CreateModel`` does not accept (it takes
Docker image manifest V2, schema 2). Without ``--push`` an image is loaded into the local Docker
(``--load``); with ``--push`` BuildKit pushes it itself (``--output type=image,push=true``) with
``oci-mediatypes=false`` named, so the manifest in the registry is Docker V2 whichever image store the
local Docker uses (its containerd store would otherwise push OCI media types).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Image:
    repository: str
    tag: str
    dockerfile: str
    platform: str
    build_args: dict[str, str] = field(default_factory=dict)
    extra: tuple[str, ...] = ()


IMAGES = {
    "lambda-arm64": Image("tessera-lambda", "arm64", "adapters/lambda/Dockerfile", "linux/arm64",
                          {"ARCH": "arm64"}, ("--provenance=false",)),
    "lambda-x86_64": Image("tessera-lambda", "x86_64", "adapters/lambda/Dockerfile", "linux/amd64",
                           {"ARCH": "x86_64"}, ("--provenance=false",)),
    # Lambda Managed Instances (multi-concurrency) support Python 3.13 and later only (AWS, "Lambda Managed
    # Instances runtimes"); the images above are 3.12
    "lambda-py313-arm64": Image("tessera-lambda", "py313-arm64", "adapters/lambda/Dockerfile", "linux/arm64",
                                {"ARCH": "arm64", "PYTHON_VERSION": "3.13"}, ("--provenance=false",)),
    "lambda-py313-x86_64": Image("tessera-lambda", "py313-x86_64", "adapters/lambda/Dockerfile", "linux/amd64",
                                 {"ARCH": "x86_64", "PYTHON_VERSION": "3.13"}, ("--provenance=false",)),
    "sagemaker-cuda": Image("tessera-sagemaker", "cuda", "adapters/sagemaker/Dockerfile.cuda", "linux/amd64",
                            extra=("--provenance=false",)),
    "sagemaker-neuron": Image("tessera-sagemaker", "neuron", "adapters/sagemaker/Dockerfile.neuron", "linux/amd64",
                              extra=("--provenance=false",)),
}
#: what an image needs beyond the defaults: (the argument, what to pass)
NEEDS = {"sagemaker-neuron": ("neuron_base_image", "--neuron-base-image <an AWS pytorch-inference-neuronx DLC with "
                                                  "Python >= 3.11>")}
#: built only when named in --only
OPT_IN = frozenset({"lambda-py313-arm64", "lambda-py313-x86_64"})


def default_images(*, neuron_base_image: str | None) -> tuple[list[str], list[str]]:
    """(the images to build when --only is not given, a line per skipped image saying what it needs)."""
    given = {"neuron_base_image": neuron_base_image}
    chosen, skipped = [], []
    for name in IMAGES:
        if name in OPT_IN:
            continue
        need = NEEDS.get(name)
        if need and not given[need[0]]:
            skipped.append(f"skipped {name}: it needs {need[1]}")
        else:
            chosen.append(name)
    return chosen, skipped


def reference(image: Image, registry: str | None, version: str | None) -> str:
    tag = f"{image.tag}-{version}" if version else image.tag
    name = f"{registry.rstrip('/')}/{image.repository}" if registry else image.repository
    return f"{name}:{tag}"


def commands(names: list[str], *, registry: str | None = None, version: str | None = None, push: bool = False,
             neuron_base_image: str | None = None) -> list[list[str]]:
    """The docker commands, in order (with ``push``, each build pushes its image)."""
    unknown = [n for n in names if n not in IMAGES]
    if unknown:
        raise ValueError(f"unknown image(s) {unknown}; choose from {sorted(IMAGES)}")
    if "sagemaker-neuron" in names and not neuron_base_image:
        raise ValueError("sagemaker-neuron needs --neuron-base-image (an AWS pytorch-inference-neuronx DLC "
                         "with Python >= 3.11); or leave it out with --only")
    builds = []
    for name in names:
        image = IMAGES[name]
        args = dict(image.build_args)
        if name == "sagemaker-neuron":
            args["BASE_IMAGE"] = neuron_base_image
        ref = reference(image, registry, version)
        command = ["docker", "buildx", "build", "--platform", image.platform, "-f", image.dockerfile,
                   *image.extra]
        for key, value in args.items():
            command += ["--build-arg", f"{key}={value}"]
        if push:
            builds.append([*command, "--output", f"type=image,name={ref},push=true,oci-mediatypes=false", "."])
        else:
            builds.append([*command, "-t", ref, "--load", "."])
    return builds


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated images (default: every image whose arguments are given)")
    parser.add_argument("--registry", help="e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com")
    parser.add_argument("--version", help="appended to each tag: arm64-VERSION")
    parser.add_argument("--push", action="store_true")
    parser.add_argument("--neuron-base-image")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    if args.push and not args.registry:
        parser.error("--push needs --registry")
    if args.only:
        names, skipped = [n.strip() for n in args.only.split(",") if n.strip()], []
    else:
        names, skipped = default_images(neuron_base_image=args.neuron_base_image)
    for line in skipped:
        print(line, file=sys.stderr)
    try:
        todo = commands(names, registry=args.registry,
                        version=args.version, push=args.push, neuron_base_image=args.neuron_base_image)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.dry_run and shutil.which("docker") is None:
        print("error: docker is not on PATH (use --dry-run to see the commands)", file=sys.stderr)
        return 1
    for command in todo:
        print(f"(cd {shlex.quote(str(ROOT))} && {shlex.join(command)})", file=out)
        if not args.dry_run:
            subprocess.run(command, cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
