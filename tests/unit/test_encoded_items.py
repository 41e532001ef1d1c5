"""Tokenized texts as ``Encoded`` items (``core.tokenization.as_encoded``): from ``FLAT_FROM`` texts a call's ids
(and type ids) are read into one array each and every item is a view of its span, below that an array each;
either way equal to the arrays read from each encoding. A single text's type ids are taken to be 0 only where
the post-processor says so (``zero_type_ids``), read from the encodings everywhere else."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from core.tokenization import FLAT_FROM, TextTokenizer, as_encoded, zero_type_ids
from tests.support.tokenizer_folders import tokenizer_variant

TEXTS = ["", "a short text", "Naïve café 東京 😀", "word " * 60, "x"]

CLS_SEP = {"[CLS]": {"id": "[CLS]", "ids": [101], "tokens": ["[CLS]"]},
           "[SEP]": {"id": "[SEP]", "ids": [102], "tokens": ["[SEP]"]}}


def _template(a: int, cls: int = 0) -> dict:
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": cls}}, {"Sequence": {"id": "A", "type_id": a}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": a}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": CLS_SEP}


#: (name, post-processor, whether a single text's type ids are all 0)
PROCESSORS = [
    ("none", None, True),
    ("bert", {"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}, True),
    ("roberta", {"type": "RobertaProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101], "trim_offsets": True,
                 "add_prefix_space": False}, True),
    ("template-zero", _template(0), True),
    ("template-one", _template(1), False),
    ("template-cls-one", _template(0, cls=1), False),
    ("sequence", {"type": "Sequence", "processors": [{"type": "ByteLevel", "add_prefix_space": False,
                                                      "trim_offsets": True, "use_regex": True}, _template(0)]}, True),
    ("sequence-one", {"type": "Sequence", "processors": [_template(1)]}, False),
]


@pytest.mark.parametrize("texts", [TEXTS[:1], TEXTS, TEXTS * 4], ids=["one", "few", "flat"])
@pytest.mark.parametrize("name,processor,zero", PROCESSORS, ids=[p[0] for p in PROCESSORS])
def test_items_hold_the_encodings_ids_and_type_ids(tmp_path, minilm_dir, name, processor, zero, texts):
    folder = tokenizer_variant(tmp_path / "tok", minilm_dir, {"post_processor": processor})
    reference = Tokenizer.from_file(str(folder / "tokenizer.json"))
    reference.no_padding()
    reference.enable_truncation(32)
    assert zero_type_ids(reference) is zero
    expected = reference.encode_batch(texts)
    if not zero:
        assert any(any(e.type_ids) for e in expected), f"{name}: the variant should give non-zero type ids"
    items = TextTokenizer(folder, 32).encode(texts)
    assert len(items) == len(texts)
    if len(texts) >= FLAT_FROM:  # views of one array
        assert all(item.ids.base is not None and item.ids.base is items[0].ids.base for item in items)
    for item, enc in zip(items, expected):
        assert item.ids.dtype == np.int64 and item.type_ids.dtype == np.int64
        assert item.ids.tolist() == enc.ids
        assert item.type_ids.tolist() == enc.type_ids
        assert item.cost == len(enc.ids) and item.pool_from == 0


def test_no_encodings_no_items():
    assert as_encoded([]) == []
    assert as_encoded([], zero_types=True) == []
