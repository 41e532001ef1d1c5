"""Model folder → Neuron folder: one ``optimum-neuron`` compilation per shape bucket, and a manifest.

    <out>/                     config, tokenizer, sentence-transformers files (copied)
    <out>/neuron/manifest.json buckets and where each one is (core.backends.buckets.Manifest)
    <out>/neuron/b8_s128/      one compiled model per bucket (optimum-neuron's save_pretrained folder)

Needs ``pip install -e '.[neuron]'`` (optimum-neuron + neuronx-cc, on an inf2/trn1 host or an image
with the Neuron SDK). The compile call per bucket is :func:`neuron_compile_kwargs`; compiling is
pluggable (``compile_bucket``) so the manifest/folder logic runs with any static-shape compiler.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Callable, Iterable

from core.backends.buckets import Bucket, Manifest, ManifestEntry, plan_buckets
from core.convert.files import copy_model_files, refuse_torch_only
from core.errors import require

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZES = (1, 8, 32)
DEFAULT_SEQUENCE_LENGTHS = (128, 256, 512)

#: compile one bucket: (source folder, output folder, bucket) → None
BucketCompiler = Callable[[Path, Path, Bucket], None]


def neuron_compile_kwargs(bucket: Bucket, *, auto_cast: str | None = "matmul", auto_cast_type: str = "bf16") -> dict:
    """Keyword arguments of ``NeuronModelForFeatureExtraction.from_pretrained`` for one bucket
    (optimum-neuron 0.4.x: input shapes and compiler options are plain keyword arguments)."""
    kwargs = {"export": True, "batch_size": bucket.batch_size, "sequence_length": bucket.sequence_length}
    if auto_cast:
        kwargs.update(auto_cast=auto_cast, auto_cast_type=auto_cast_type)
    return kwargs


def neuron_compiler(*, auto_cast: str | None = "matmul", auto_cast_type: str = "bf16") -> BucketCompiler:
    """The optimum-neuron compiler; fails at once (MissingDependency naming [neuron]) when it is absent."""
    from core.backends.neuron import neuron_model_class

    model_class = neuron_model_class("encoder")

    def compile_bucket(src: Path, out: Path, bucket: Bucket) -> None:
        kwargs = neuron_compile_kwargs(bucket, auto_cast=auto_cast, auto_cast_type=auto_cast_type)
        log.info("compiling %s for %s: %s", src, bucket, kwargs)
        model = model_class.from_pretrained(str(src), **kwargs)
        model.save_pretrained(str(out))

    return compile_bucket


def compile_buckets(src: Path, dst: Path, *, batch_sizes: Iterable[int] = DEFAULT_BATCH_SIZES,
                    sequence_lengths: Iterable[int] = DEFAULT_SEQUENCE_LENGTHS,
                    compile_bucket: BucketCompiler | None = None, runtime: str = "neuron",
                    dtype: str | None = "bf16") -> Manifest:
    """Plan the buckets, compile each into ``dst/neuron/<bucket>``, copy the model files, write the manifest."""
    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    refuse_torch_only(src, None, "a Neuron compilation")
    buckets = plan_buckets(batch_sizes, sequence_lengths, max_positions=config.get("max_position_embeddings"))
    if compile_bucket is None:
        require("optimum.neuron", "neuron")
        compile_bucket = neuron_compiler()
    folder = dst / "neuron"
    folder.mkdir(parents=True, exist_ok=True)
    if dst.resolve() != src.resolve():
        copy_model_files(src, dst)
    entries = []
    for bucket in buckets:
        out = folder / bucket.dirname
        shutil.rmtree(out, ignore_errors=True)
        compile_bucket(src, out, bucket)
        entries.append(ManifestEntry(bucket, bucket.dirname))
    manifest = Manifest(entries=entries, runtime=runtime, source=src.name, dtype=dtype)
    manifest.write(folder)
    return manifest
