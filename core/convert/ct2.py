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
from core.convert.files import copy_model_files, refuse_torch_only
from core.errors import Unsupported, require
from core.loading import PARITY_RECORD, custom_code

log = logging.getLogger(__name__)


def convert_folder(src: Path, dst: Path, *, quantization: str | None = None, force: bool = True,
                   trust_remote_code: bool = False) -> Path:
    """Write ``dst`` (may equal ``src``) with the model files and ``dst/ct2/``; returns ``dst``.

    A model with its own code (config ``auto_map``) is refused unless ``trust_remote_code``: CTranslate2 converts
    transformers' built-in class of the ``model_type``, which may compute something else. With it, the converted
    encoder is checked against the model as its own code computes it, and kept only if it matches
    (``ct2/parity.json`` records that; the backend serves such a model only with it)."""
    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    refuse_torch_only(src, None, "a CTranslate2 conversion")
    code = custom_code(config)
    if code is not None and not trust_remote_code:
        raise Unsupported(
            f"{src}: config.json names the model's own code ({code}); CTranslate2 converts transformers' built-in "
            f"{config.get('model_type')!r} class, which would drop what that code does and give different vectors. "
            "Pass --trust-remote-code to convert it and keep the result only if it matches the model's own code, "
            "or serve the folder with backend torch and trust_remote_code: true", code="custom_code")
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
    if code is not None:
        check_against_own_code(src, dst, code)
    return dst


def check_against_own_code(src: Path, dst: Path, code: str) -> float:
    """The converted encoder against the model loaded with its own code, on the export cache's probe texts;
    below the parity gate the conversion is removed and ``Unsupported`` says why. Returns the worst cosine."""
    import shutil

    from core.backends.ct2 import CT2Backend
    from core.convert.onnx_export import load_head_model
    from core.convert.export_cache import PARITY_MIN_COSINE, compare, probe_inputs, torch_outputs

    feeds = probe_inputs(src, "encoder")
    want = torch_outputs(load_head_model(src, "encoder", trust_remote_code=True), "encoder", feeds)
    backend = CT2Backend()
    backend.load(dst, head="encoder", device="cpu", dtype="float32", threads=1)
    cosines, _ = compare(dict(backend.run(feeds)), want, feeds["attention_mask"])
    worst = min(cosines.values())
    if worst < PARITY_MIN_COSINE:
        shutil.rmtree(dst / CT2_SUBDIR, ignore_errors=True)
        raise Unsupported(
            f"{src}: the model's own code ({code}) computes something CTranslate2's conversion of the built-in "
            f"class does not (worst cosine {worst:.4f} against the model as its code runs it; needs "
            f"{PARITY_MIN_COSINE}); the conversion was removed. Serve it with backend torch and trust_remote_code: "
            "true, or export it to ONNX with `python scripts/export_onnx.py MODEL OUT --trust-remote-code`",
            code="custom_code")
    record = {"own_code": code, "checked": {"model.bin": round(worst, 7)}}
    (dst / CT2_SUBDIR / PARITY_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    log.info("checked against the model's own code: worst cosine %.6f", worst)
    return worst


@contextlib.contextmanager
def _converter_view(src: Path, config: dict):
    """The folder the converter reads. transformers 5.x no longer writes ``position_embedding_type`` in
    BERT/RoBERTa/XLM-R configs and CTranslate2's loaders read it (RoBERTa's asserts "absolute"); CTranslate2 picks
    its loader by architecture and has none for a Stanford ColBERT checkpoint's ``HF_ColBERT`` (a BERT encoder
    plus the projection the task runs): such a folder is presented through a temporary view (links to every
    file, config.json with the key added, ``architectures: ["BertModel"]``)."""
    changes = {}
    if config.get("model_type") in ("bert", "roberta", "xlm-roberta") and "position_embedding_type" not in config:
        changes["position_embedding_type"] = "absolute"
    if "HF_ColBERT" in (config.get("architectures") or ()):  # a Stanford ColBERT checkpoint: its BERT encoder
        changes["architectures"] = ["BertModel"]
    if not changes:
        yield src
        return
    with tempfile.TemporaryDirectory(prefix="tessera-ct2-") as tmp:
        view = Path(tmp)
        for path in src.iterdir():
            if path.name != "config.json":
                (view / path.name).symlink_to(path.resolve())
        (view / "config.json").write_text(json.dumps({**config, **changes}))
        yield view


def _tokenizer_files(src: Path) -> list[str]:
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
    return [n for n in names if (src / n).exists()]
