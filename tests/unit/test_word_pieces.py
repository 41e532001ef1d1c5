"""The memo of words' pieces (``core.word_pieces``): plain texts tokenized from the pieces of words seen before
must get the very ids the folder's own tokenizer gives them, whatever the normalizer's case, the truncation side,
the added tokens, the memo's fill; and tokenizers whose cuts the memo does not know get no memo."""

from __future__ import annotations

import json
import random
import re
import string

import pytest

from core import word_pieces
from core.tokenization import TextTokenizer, is_plain_with_spaces
from tests.support.tokenizer_folders import reference_encodings, tokenizer_variant

MAX_LENGTH = 24
UNCASED = {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "strip_accents": None,
           "lowercase": True}
CASED = {**UNCASED, "lowercase": False}


def _texts(seed: int = 0, n: int = 400) -> list[str]:
    """Plain texts: words in any case, digits, punctuation alone and inside words, whitespace of every plain kind,
    words longer than the memo keeps and than ``WordPiece`` cuts, the special tokens' names, empty ones."""
    rng = random.Random(seed)
    words = ["Hello", "WORLD", "embed", "vector", "a", "I'm", "e-mail", "U.S.A.", "x2", "2x", "1,000.50", "C++",
             "unaffable", "tokenizers", "##ing", "[CLS]", "[mask]", "[MASK]", "x[SEP]y", "[UNK", "PAD]", "...",
             "$5", "(a)", "snake_case", "CamelCase", "https://example.com/p?q=1", "a@b.co", string.punctuation,
             "z" * 39, "y" * 41, "q" * 101, "Supercalifragilisticexpialidocious", "\t", "\n", "\r\n", "  "]
    texts = ["", " ", "\t\n", "plain words only", "word " * 40, string.printable.strip("\x0b\x0c"),
             "ends with a space ", " starts with one"]
    for _ in range(n):
        texts.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))))
        if rng.random() < 0.3:  # random letters: words the memo has not seen
            texts.append("".join(rng.choice(string.ascii_letters + string.digits + " .,-")
                                 for _ in range(rng.randint(1, 60))))
    assert all(is_plain_with_spaces(t) for t in texts)
    return texts


def _reference(folder, texts, truncation):
    return [e.ids for e in reference_encodings(folder, texts, truncation, MAX_LENGTH)]


def _ids(tokenizer, texts, truncation):
    truncate = truncation != "full"
    return [e.ids.tolist() for e in tokenizer.encode(texts, truncate=truncate, check_length=False,
                                                     direction="left" if truncation == "left" else "right")]


def _from_memo(tokenizer, texts) -> int:
    """How many of ``texts`` the memo answers (the rest go to the library)."""
    return sum(ids is not None for ids in tokenizer._memo.encode(texts, keep=None))


POST = {
    "template": None,  # the folder's own: [CLS] $A [SEP]
    "bert": {"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]},
    "two-before": {"type": "TemplateProcessing",
                   "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                              {"SpecialToken": {"id": "[MASK]", "type_id": 0}},
                              {"Sequence": {"id": "A", "type_id": 0}}],
                   "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                   "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [101], "tokens": ["[CLS]"]},
                                      "[MASK]": {"id": "[MASK]", "ids": [103], "tokens": ["[MASK]"]}}},
}


@pytest.mark.parametrize("normalizer", [UNCASED, CASED], ids=["uncased", "cased"])
@pytest.mark.parametrize("post", list(POST), ids=list(POST))
def test_the_memo_gives_the_folder_tokenizers_ids(tmp_path, minilm_dir, normalizer, post):
    parts = {"normalizer": normalizer}
    if POST[post] is not None:
        parts["post_processor"] = POST[post]
    folder = tokenizer_variant(tmp_path / "tok", minilm_dir, parts)
    tokenizer = TextTokenizer(folder, MAX_LENGTH)
    assert tokenizer._memo is not None
    texts = _texts()
    for truncation in ("right", "left", "full"):
        want = _reference(folder, texts, truncation)
        # a call of them all, then again with the memo filled, then one at a time
        assert _ids(tokenizer, texts, truncation) == want, truncation
        assert _ids(tokenizer, texts, truncation) == want, truncation
        assert [_ids(tokenizer, [t], truncation)[0] for t in texts] == want, truncation
    # the memo answered every text without an added token's name or a word longer than it keeps
    easy = [t for t in texts
            if "[" not in t and max(map(len, re.findall("[0-9A-Za-z]+", t)), default=0) <= word_pieces.LONGEST_WORD]
    assert len(easy) > 150 and _from_memo(tokenizer, easy) == len(easy)
    assert _from_memo(tokenizer, ["a [MASK] here", "x[sep]y", "y" * 41]) == 0


def test_a_full_memo_sends_new_words_to_the_library(tmp_path, minilm_dir, monkeypatch):
    monkeypatch.setattr(word_pieces, "CAPACITY", 20)
    folder = tokenizer_variant(tmp_path / "tok", minilm_dir, {"normalizer": UNCASED})
    tokenizer = TextTokenizer(folder, MAX_LENGTH)
    texts = _texts(seed=1, n=100)
    assert _ids(tokenizer, texts, "right") == _reference(folder, texts, "right")
    assert len(tokenizer._memo._words) == 20
    known = [" ".join(tokenizer._memo._words)]
    assert _from_memo(tokenizer, known) == 1 and _from_memo(tokenizer, ["unseen words here"]) == 0


def test_an_added_token_is_matched_by_the_library_not_cut_by_the_memo(tmp_path, minilm_dir):
    """An added token (here one normalized=true, matched inside words too) is found before the pre-tokenizer cuts
    the text: a text that holds it, in any case, goes to the library."""
    folder = tokenizer_variant(tmp_path / "tok", minilm_dir, {"normalizer": UNCASED})
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["added_tokens"].append({"id": 30522, "content": "emb", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": True, "special": False})
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    tokenizer = TextTokenizer(folder, MAX_LENGTH)
    texts = ["embed this", "EMBEDDING", "a plain text", "re-embedded", "em b"]
    assert _ids(tokenizer, texts, "right") == _reference(folder, texts, "right")
    assert 30522 in _ids(tokenizer, ["EMBEDDING"], "right")[0]
    assert _from_memo(tokenizer, texts) == 2  # "a plain text", "em b"


@pytest.mark.parametrize("parts", [
    {"normalizer": UNCASED, "pre_tokenizer": {"type": "Whitespace"}},
    {"normalizer": UNCASED, "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                                              "split": True}},
    {"normalizer": UNCASED, "post_processor": {
        "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 1}},
                                                 {"Sequence": {"id": "A", "type_id": 1}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [101], "tokens": ["[CLS]"]}}}},
    {"normalizer": UNCASED, "post_processor": {  # the text twice: not the same ids around it
        "type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                                 {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                                                 {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 0}}],
        "special_tokens": {"[SEP]": {"id": "[SEP]", "ids": [102], "tokens": ["[SEP]"]}}}},
    {"normalizer": {"type": "Lowercase"}},  # no twin: as cheap as it would be
], ids=["whitespace-pre-tokenizer", "metaspace", "type-id-1", "text-twice", "no-twin"])
def test_no_memo_where_its_cuts_are_not_the_tokenizers(tmp_path, minilm_dir, parts):
    folder = tokenizer_variant(tmp_path / "tok", minilm_dir, parts)
    tokenizer = TextTokenizer(folder, MAX_LENGTH)
    assert tokenizer._memo is None
    texts = _texts(n=40)
    got = tokenizer.encode(texts, check_length=False)
    assert [e.ids.tolist() for e in got] == _reference(folder, texts, "right")


def test_no_memo_when_asked_for_none(minilm_dir):
    assert TextTokenizer(minilm_dir, MAX_LENGTH)._memo is not None
    assert TextTokenizer(minilm_dir, MAX_LENGTH, memo=False)._memo is None
