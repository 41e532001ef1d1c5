"""A near-free stand-in of the default model for measurements where the model's cost would hide the job's
own (peak RSS over a million rows): all-MiniLM-L6-v2's folder (tokenizer, pooling, normalize, hidden size
384, so its vectors are the same size) with a random one-layer encoder, exported to ONNX once under
``.venv/models/``. Built from a config with ``transformers``; no hub access."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from benchmarks.artifacts import MODELS_DIR
from benchmarks.task_models import MINILM_L6

LIGHT_NAME = "minilm-l1-onnx"


def build_light_minilm(minilm: Path, out: Path, seed: int = 0) -> Path:
    """``out``: MiniLM's folder with a random 1-layer ``BertModel`` (hidden 384) in place of its 6 layers,
    exported to ONNX fp32 (``out/onnx/model.onnx``)."""
    import torch
    from transformers import BertConfig, BertModel

    from core.convert.onnx_export import export_folder

    with tempfile.TemporaryDirectory(prefix="tessera-light-minilm-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(minilm, src, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "onnx", "README.md"))
        torch.manual_seed(seed)
        BertModel(BertConfig(**{**MINILM_L6, "num_hidden_layers": 1}), add_pooling_layer=False).eval() \
            .save_pretrained(src)
        staging = out.with_name(out.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        export_folder(src, staging)
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    return out


def ensure_light_minilm(minilm: Path) -> Path:
    """The near-free model folder, built once into .venv/models/."""
    out = MODELS_DIR / LIGHT_NAME
    if not (out / "onnx" / "model.onnx").exists():
        print(f"building {out} ...", flush=True)
        build_light_minilm(minilm, out)
    return out
