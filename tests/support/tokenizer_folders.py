"""A model folder whose tokenizer.json is all-MiniLM-L6-v2's with some of its parts replaced (the normalizer,
the pre-tokenizer, the post-processor): the tokenizer variants the tokenization tests hold Tessera to."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

_FILES = ("config.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def tokenizer_variant(out: Path, minilm_dir: Path, parts: dict) -> Path:
    """``out`` made a tokenizer folder: MiniLM's files, its tokenizer.json with each of ``parts`` (a top-level
    key such as ``normalizer``, ``pre_tokenizer`` or ``post_processor``) replaced."""
    out.mkdir()
    for name in _FILES:
        if (minilm_dir / name).exists():
            shutil.copy(minilm_dir / name, out / name)
    spec = json.loads((minilm_dir / "tokenizer.json").read_text())
    spec.update(parts)
    (out / "tokenizer.json").write_text(json.dumps(spec))
    return out


def reference_encodings(folder: Path, texts: list[str], truncation: str, max_length: int) -> list:
    """The ``tokenizers`` library's own encodings of ``texts`` by ``folder``'s tokenizer.json, unpadded, truncating
    at ``max_length`` from the ``right`` or ``left``, or not at all (``full``): what Tessera's tokenization must
    give."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    if truncation == "full":
        tok.no_truncation()
    else:
        tok.enable_truncation(max_length, direction=truncation)
    return tok.encode_batch(texts)
