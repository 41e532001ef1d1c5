"""Model folder → CTranslate2 folder: ``ctranslate2.converters.TransformersConverter`` on the encoder.

The output is a complete model folder: config, tokenizer and sentence-transformers files copied (the
pooling/normalize settings come from them), and the converted encoder in ``ct2/`` (``model.bin``,
``config.json``, vocabulary). Weights are stored as float32 (or float16 with ``quantization``); the
compute type (float32 / int8 / int8_float32 on CPU, float16 / bfloat16 / int8_float16 on CUDA) is chosen
when the folder is served, from the model's ``dtype``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
from pathlib import Path

from core.backends.ct2 import CT2_SUBDIR, check_architecture
from core.convert.files import copy_model_files
from core.errors import require

log = logging.getLogger(__name__)


def convert_folder(src: Path, dst: Path, *, quantization: str | None = None, force: bool = True) -> Path:
    """Write ``dst`` (may equal ``src``) with the model files and ``dst/ct2/``; returns ``dst``."""
    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    check_architecture(config, src)
    ctranslate2 = require("ctranslate2", "ct2")
    require("transformers", "ct2")
    require("torch", "ct2")
    dst.mkdir(parents=True, exist_ok=True)
    if dst.resolve() != src.resolve():
        copy_model_files(src, dst)
    with _converter_view(src, config) as view:
        converter = ctranslate2.converters.TransformersConverter(str(view), copy_files=_tokenizer_files(src))
        out = converter.convert(str(dst / CT2_SUBDIR), quantization=quantization, force=force)
    log.info("converted %s to %s", src, out)
    return dst


@contextlib.contextmanager
def _converter_view(src: Path, config: dict):
    """The folder the converter reads. transformers 5.x no longer writes ``position_embedding_type`` in
    BERT/RoBERTa/XLM-R configs and CTranslate2's loaders read it (RoBERTa's asserts "absolute"): such a folder is
    presented through a temporary view (links to every file, config.json with the key added)."""
    if config.get("model_type") not in ("bert", "roberta", "xlm-roberta") or "position_embedding_type" in config:
        yield src
        return
    with tempfile.TemporaryDirectory(prefix="tessera-ct2-") as tmp:
        view = Path(tmp)
        for path in src.iterdir():
            if path.name != "config.json":
                (view / path.name).symlink_to(path.resolve())
        (view / "config.json").write_text(json.dumps({**config, "position_embedding_type": "absolute"}))
        yield view


def _tokenizer_files(src: Path) -> list[str]:
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
    return [n for n in names if (src / n).exists()]
