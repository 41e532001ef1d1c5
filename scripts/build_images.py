#!/usr/bin/env python
"""Build (and optionally push) the Tessera images: Lambda arm64 / x86_64, SageMaker CUDA and Neuron.

    python scripts/build_images.py [--only lambda-arm64,lambda-x86_64,sagemaker-cuda,sagemaker-neuron]
        [--registry ACCOUNT.dkr.ecr.REGION.amazonaws.com] [--version v1] [--push]
        [--neuron-base-image <pytorch-inference-neuronx DLC>] [--dry-run]

Run from anywhere; the build context is the repository root. Each image is tagged
``[REGISTRY/]REPOSITORY:TAG`` where TAG is the variant (arm64, x86_64, cuda, neuron), with
``-VERSION`` appended when --version is given. ``--dry-run`` prints the docker commands only.
``--push`` needs ``docker login`` to the registry first:
``aws ecr get-login-password | docker login --username AWS --password-stdin REGISTRY``.
Lambda images are built with ``--provenance=false``: Lambda rejects the image index that BuildKit's
provenance attestation produces.
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
    "sagemaker-cuda": Image("tessera-sagemaker", "cuda", "adapters/sagemaker/Dockerfile.cuda", "linux/amd64"),
    "sagemaker-neuron": Image("tessera-sagemaker", "neuron", "adapters/sagemaker/Dockerfile.neuron", "linux/amd64"),
}


def reference(image: Image, registry: str | None, version: str | None) -> str:
    tag = f"{image.tag}-{version}" if version else image.tag
    name = f"{registry.rstrip('/')}/{image.repository}" if registry else image.repository
    return f"{name}:{tag}"


def commands(names: list[str], *, registry: str | None = None, version: str | None = None, push: bool = False,
             neuron_base_image: str | None = None) -> list[list[str]]:
    """The docker commands, in order: every build, then every push."""
    unknown = [n for n in names if n not in IMAGES]
    if unknown:
        raise ValueError(f"unknown image(s) {unknown}; choose from {sorted(IMAGES)}")
    if "sagemaker-neuron" in names and not neuron_base_image:
        raise ValueError("sagemaker-neuron needs --neuron-base-image (an AWS pytorch-inference-neuronx DLC "
                         "with Python >= 3.11); or leave it out with --only")
    builds, pushes = [], []
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
        builds.append([*command, "-t", ref, "--load", "."])
        if push:
            pushes.append(["docker", "push", ref])
    return builds + pushes


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(IMAGES), help="comma-separated images (default: all four)")
    parser.add_argument("--registry", help="e.g. 123456789012.dkr.ecr.us-east-1.amazonaws.com")
    parser.add_argument("--version", help="appended to each tag: arm64-VERSION")
    parser.add_argument("--push", action="store_true")
    parser.add_argument("--neuron-base-image")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    if args.push and not args.registry:
        parser.error("--push needs --registry")
    try:
        todo = commands([n.strip() for n in args.only.split(",") if n.strip()], registry=args.registry,
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
