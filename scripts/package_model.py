#!/usr/bin/env python
"""Package model folders into the SageMaker ``model.tar.gz`` layout and upload it to S3.

    python scripts/package_model.py MODEL_DIR [MODEL_DIR ...] [--name NAME] [--config tessera.yaml]
        [--output model.tar.gz] [--s3 s3://BUCKET/PREFIX/] [--region R] [--dry-run]

The tarball holds one folder per model at its top (served under the folder name, or ``--name`` for a
single model), with everything the folder has: the weights and tokenizer, and the ``onnx/``, ``ct2/``
and ``neuron/`` artifacts of scripts/export_onnx.py, convert_ct2.py and compile_neuron.py. SageMaker
unpacks it into ``/opt/ml/model``, which ``adapters/sagemaker/models.py`` reads. ``--config`` adds a
``tessera.yaml`` at the top (its relative model paths are relative to /opt/ml/model).

Packing prints its progress (bytes read, on stderr); ``--s3`` uploads with boto3's ``upload_file``
(multipart for large files), printing progress; the tarball goes to ``PREFIX/model.tar.gz``.
``--dry-run`` writes nothing and calls nothing: it lists what the tarball would hold (files, bytes
before compression) and prints the S3 call.
Needs the [sagemaker] extra (boto3) for the upload only.
"""

from __future__ import annotations

import argparse
import os
import sys
import tarfile
import threading
from pathlib import Path
from typing import Callable, Iterable, TextIO

CONFIG_NAMES = ("tessera.yaml", "tessera.yml", "tessera.json")
#: never packaged: VCS, caches, and the test suite's build markers
SKIP_NAMES = {".git", "__pycache__", ".complete", ".DS_Store", ".cache"}


def _filter(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if any(part in SKIP_NAMES for part in Path(info.name).parts):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def model_names(folders: list[Path], name: str | None) -> list[str]:
    if name and len(folders) != 1:
        raise ValueError("--name applies to a single model folder")
    names = [name] if name else [folder.resolve().name for folder in folders]
    if len(set(names)) != len(names):
        raise ValueError(f"two model folders would share a name: {names}")
    return names


def plan(folders: Iterable[Path], *, name: str | None = None, config: Path | None = None) -> list[tuple[Path, str]]:
    """Every entry the tarball will hold, in order: (path on disk, name in the tarball). Checks the inputs."""
    folders = [Path(f) for f in folders]
    for folder in folders:
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder} is not a model folder (no config.json)")
    if config is not None and config.name not in CONFIG_NAMES:
        raise ValueError(f"the settings file must be named one of {CONFIG_NAMES}, not {config.name}")
    entries: list[tuple[Path, str]] = []
    for folder, arcname in zip(folders, model_names(folders, name)):
        entries.append((folder, arcname))
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            if not any(part in SKIP_NAMES for part in relative.parts):
                entries.append((path, f"{arcname}/{relative.as_posix()}"))
    if config is not None:
        entries.append((config, config.name))
    return entries


def plan_size(entries: list[tuple[Path, str]]) -> int:
    return sum(path.stat().st_size for path, _ in entries if path.is_file() and not path.is_symlink())


class _Reading:
    """A file object that reports the bytes read from it (tarfile reads in chunks)."""

    def __init__(self, handle, callback: Callable[[int], None]) -> None:
        self.handle, self.callback = handle, callback

    def read(self, size: int = -1) -> bytes:
        data = self.handle.read(size)
        self.callback(len(data))
        return data


def build_tarball(folders: Iterable[Path], output: Path, *, name: str | None = None,
                  config: Path | None = None, progress: Callable[[int], None] | None = None) -> Path:
    """Write ``output`` (gzip tar): ``NAME/...`` per model folder, plus ``tessera.yaml`` if given;
    ``progress`` is called with the bytes read as they are packed."""
    entries = plan(folders, name=name, config=config)
    output.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(output, "w:gz", compresslevel=6) as tar:
        for path, arcname in entries:
            info = _filter(tar.gettarinfo(str(path), arcname=arcname))
            if info.isfile():
                with open(path, "rb") as handle:
                    tar.addfile(info, _Reading(handle, progress) if progress else handle)
            else:
                tar.addfile(info)
    return output


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix/`` → (bucket, key of model.tar.gz); a URL ending in .tar.gz is the key itself."""
    if not url.startswith("s3://"):
        raise ValueError(f"not an S3 URL: {url!r}")
    bucket, _, key = url[5:].partition("/")
    if not bucket:
        raise ValueError(f"no bucket in {url!r}")
    if not key.endswith(".tar.gz"):
        key = f"{key.rstrip('/')}/model.tar.gz".lstrip("/")
    return bucket, key


class Progress:
    """boto3 transfer callback: prints the percentage uploaded, at most once per whole percent."""

    def __init__(self, total: int, out: TextIO | None = None, label: str = "upload") -> None:
        self.total, self.out, self.label = max(total, 1), out or sys.stderr, label
        self.seen = 0
        self.last = -1
        self._lock = threading.Lock()  # s3transfer calls back from its worker threads

    def __call__(self, nbytes: int) -> None:
        with self._lock:
            self.seen += nbytes
            percent = min(100, self.seen * 100 // self.total)
            if percent != self.last:
                self.last = percent
                self.out.write(f"\r{self.label}: {percent:3d}% ({self.seen / 1e6:.1f}/{self.total / 1e6:.1f} MB)")
                if percent == 100:
                    self.out.write("\n")
                self.out.flush()


def upload(client, tarball: Path, bucket: str, key: str, *,
           callback: Callable[[int], None] | None = None, config=None) -> str:
    """Upload with the S3 client's managed transfer (multipart above 8 MB, or ``config``, a
    ``boto3.s3.transfer.TransferConfig``); returns the s3:// URL."""
    client.upload_file(str(tarball), bucket, key, Config=config,
                       Callback=callback or Progress(tarball.stat().st_size, label=f"s3://{bucket}/{key}"))
    return f"s3://{bucket}/{key}"


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", type=Path, help="model folders (config.json at the top)")
    parser.add_argument("--name", help="served name of a single model (default: the folder name)")
    parser.add_argument("--config", type=Path, help="tessera.yaml to put at the top of the tarball")
    parser.add_argument("--output", type=Path, default=Path("model.tar.gz"))
    parser.add_argument("--s3", help="s3://BUCKET/PREFIX/ to upload to (PREFIX/model.tar.gz)")
    parser.add_argument("--region", default=None)
    parser.add_argument("--dry-run", action="store_true", help="print the S3 call instead of uploading")
    args = parser.parse_args(argv)
    try:
        bucket, key = split_s3_url(args.s3) if args.s3 else (None, None)
        entries = plan(args.models, name=args.name, config=args.config)
    except ValueError as exc:
        parser.error(str(exc))
    total = plan_size(entries)
    if args.dry_run:
        files = sum(1 for path, _ in entries if not path.is_dir())
        print(f"would write {args.output} ({files} files, {total / 1e6:.1f} MB before compression)", file=out)
        if bucket is not None:
            print(f"s3.upload_file(Filename={str(args.output)!r}, Bucket={bucket!r}, Key={key!r})", file=out)
        return 0
    tarball = build_tarball(args.models, args.output, name=args.name, config=args.config,
                            progress=Progress(total, label=f"packing {args.output}"))
    print(f"wrote {tarball} ({tarball.stat().st_size / 1e6:.1f} MB)", file=out)
    if bucket is None:
        return 0
    import boto3  # the [sagemaker] extra

    client = boto3.client("s3", region_name=args.region or os.environ.get("AWS_REGION"))
    print(upload(client, tarball, bucket, key), file=out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
