"""A real static-shape runtime for the bucket logic: MiniLM exported to ONNX with FIXED dimensions per
bucket (no dynamic axes), run by ONNX Runtime. It plays the part the Neuron compiler/runtime play on
Inferentia: each compiled file runs exactly one (batch, sequence) shape and refuses any other."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import ClassVar

import numpy as np

from core.backends.buckets import Bucket, BucketedBackend

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def export_static(src: Path, out: Path, bucket: Bucket) -> None:
    """Compile one bucket: ``out/model.onnx`` taking exactly (batch_size, sequence_length) inputs."""
    import torch
    import transformers

    model = transformers.AutoModel.from_pretrained(str(src), dtype=torch.float32, attn_implementation="eager")
    model.eval()
    names = [n for n in INPUTS if n in inspect.signature(model.forward).parameters]

    class Encoder(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return self.inner(**dict(zip(names, args))).last_hidden_state

    shape = (bucket.batch_size, bucket.sequence_length)
    sample = tuple(torch.ones(shape, dtype=torch.long) if n != "token_type_ids" else torch.zeros(shape, dtype=torch.long)
                   for n in names)
    out.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        torch.onnx.export(Encoder(model), sample, str(out / "model.onnx"), input_names=names,
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False)


class StaticOnnxBackend(BucketedBackend):
    """The bucketed backend over fixed-shape ONNX files (manifest runtime ``onnx-static``)."""

    name: ClassVar[str] = "static-onnx"

    def load_bucket(self, path: Path, bucket: Bucket, *, device: str, threads: int):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        session = ort.InferenceSession(str(path / "model.onnx"), sess_options=opts,
                                       providers=["CPUExecutionProvider"])
        fixed = [tuple(i.shape) for i in session.get_inputs()]
        assert all(s == (bucket.batch_size, bucket.sequence_length) for s in fixed), fixed
        names = {i.name for i in session.get_inputs()}

        def call(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            (hidden,) = session.run(["last_hidden_state"], {k: v for k, v in feeds.items() if k in names})
            return {"last_hidden_state": hidden}

        return call
