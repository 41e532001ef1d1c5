"""The plain-text twin of a tokenizer (``core.tokenization.ascii_twin``): texts of printable ASCII are tokenized
by a copy whose normalizer only lowercases, and must get the very tokens the folder's own tokenizer gives them,
whatever the normalizer's options, truncation side, or mix of plain and other texts in one call."""

from __future__ import annotations

import json
import random
import shutil
import string

import pytest
from tokenizers import Tokenizer

from core.errors import InvalidInput
from core.tokenization import TextTokenizer, ascii_twin, is_plain, is_plain_with_spaces
from tests.support.tokenizer_folders import reference_encodings, tokenizer_variant

MAX_LENGTH = 24

#: (name, normalizer, pre-tokenizer or None for the folder's BertPreTokenizer)
VARIANTS = [
    ("bert-uncased", {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                      "strip_accents": None, "lowercase": True}, None),
    ("bert-cased", {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                    "strip_accents": False, "lowercase": False}, None),
    ("bert-no-clean", {"type": "BertNormalizer", "clean_text": False, "handle_chinese_chars": False,
                       "strip_accents": True, "lowercase": True}, None),
    ("sequence", {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Lowercase"},
                                                      {"type": "StripAccents"}]}, None),
    ("bert-metaspace", {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                        "strip_accents": None, "lowercase": True},
     {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}),
]


def _texts(seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    plain = ["Hello", "WORLD", "embed", "vector", "a", "I'm", "e-mail", "U.S.A.", "x2", "[CLS]", "[MASK]", "##ing",
             "  ", "...", "$5", "C++", string.punctuation, "\t", "\n", "\r\n"]
    other = ["naïve", "café", "東京", "Straße", "😀", "\x00", "\x0b", "\x7f", "\u00a0", "\u200b"]
    texts = ["", " ", "plain words only", "Tabs\tand\nnew\r\nlines", "UPPER lower MiXeD 123",
             "a [MASK] token", "control\x01char", "del\x7fchar", string.printable, "word " * 40]
    for i in range(120):  # half of plain words only, half with others among them
        words = plain if i % 2 else plain + other
        texts.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))))
    return texts


def _folder(tmp_path, minilm_dir, normalizer: dict, pre: dict | None):
    parts = {"normalizer": normalizer} if pre is None else {"normalizer": normalizer, "pre_tokenizer": pre}
    return tokenizer_variant(tmp_path / "tok", minilm_dir, parts)


def _reference(folder, texts, truncation):
    return [(e.ids, e.type_ids) for e in reference_encodings(folder, texts, truncation, MAX_LENGTH)]


@pytest.mark.parametrize("name,normalizer,pre", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_the_twin_gives_the_folder_tokenizers_tokens(tmp_path, minilm_dir, name, normalizer, pre):
    folder = _folder(tmp_path, minilm_dir, normalizer, pre)
    tokenizer = TextTokenizer(folder, MAX_LENGTH)
    assert tokenizer._twin_of is not None, f"{name}: expected a plain-text twin"
    expected_plain = is_plain if pre is not None else is_plain_with_spaces  # Metaspace keeps a newline apart
    assert tokenizer._twin_of[1] is expected_plain
    texts = _texts()
    plain = [t for t in texts if expected_plain(t)]
    assert 15 < len(plain) < len(texts), "the texts must mix plain and other ones"
    for truncate, direction, truncation in ((True, "right", "right"), (True, "left", "left"),
                                            (False, "right", "full")):
        want = _reference(folder, texts, truncation)
        # all at once (a mix), plain ones alone (the one-pass path), one at a time
        mixed = tokenizer.encode(texts, truncate=truncate, check_length=False, direction=direction)
        alone = tokenizer.encode(plain, truncate=truncate, check_length=False, direction=direction)
        single = [tokenizer.encode([t], truncate=truncate, check_length=False, direction=direction)[0]
                  for t in texts]
        for got in (mixed, single):
            assert [(e.ids.tolist(), e.type_ids.tolist()) for e in got] == want, (name, truncation)
        want_plain = [w for t, w in zip(texts, want) if expected_plain(t)]
        assert [(e.ids.tolist(), e.type_ids.tolist()) for e in alone] == want_plain, (name, truncation)
    assert set(tokenizer._twins) == {"right", "left", "full"}, "the plain texts went through the twins"


def test_no_twin_where_the_normalizer_may_change_ascii(tmp_path, minilm_dir):
    for normalizer in ({"type": "Replace", "pattern": {"String": "a"}, "content": "b"},
                       {"type": "Sequence", "normalizers": [{"type": "Lowercase"},
                                                            {"type": "Replace", "pattern": {"String": "a"},
                                                             "content": "b"}]},
                       {"type": "Lowercase"}, {"type": "NFKC"}, None):
        folder = _folder(tmp_path, minilm_dir, normalizer, None)
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        assert ascii_twin(tok) is None, normalizer
        tokenizer = TextTokenizer(folder, MAX_LENGTH)
        texts = ["a plain Text", "banana"]
        got = [e.ids.tolist() for e in tokenizer.encode(texts)]
        assert got == [ids for ids, _ in _reference(folder, texts, "right")]
        shutil.rmtree(folder)


def test_an_added_token_with_a_space_keeps_newlines_off_the_twin(tmp_path, minilm_dir):
    """``clean_text`` turns a newline into a space before added tokens normalized=true are matched."""
    folder = _folder(tmp_path, minilm_dir, VARIANTS[0][1], None)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["added_tokens"].append({"id": 30522, "content": "new york", "single_word": False, "lstrip": False,
                                 "rstrip": False, "normalized": True, "special": False})
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    tokenizer = TextTokenizer(folder, MAX_LENGTH)
    assert tokenizer._twin_of[1] is is_plain
    texts = ["new\nyork", "new york", "New York city"]
    assert [e.ids.tolist() for e in tokenizer.encode(texts)] == [ids for ids, _ in _reference(folder, texts, "right")]


def test_a_text_that_is_not_unicode_is_named_by_its_place_in_a_mixed_call(minilm_dir):
    tokenizer = TextTokenizer(minilm_dir, MAX_LENGTH)
    with pytest.raises(InvalidInput, match=r"input\[2\] is not valid Unicode"):
        tokenizer.encode(["plain", "café", "bad \ud800 text", "plain too"])


def test_plain_is_printable_ascii_and_nothing_else():
    """Every code point alone, and inside a plain text: plain is U+0020..U+007E, with spaces also tab, newline and
    carriage return (U+000B, U+000C, U+0085, U+2028 are whitespace to Python, and not plain)."""
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        char = chr(code)
        printable = 0x20 <= code <= 0x7E
        spaced = printable or char in "\t\n\r"
        for text in (char, f"a plain {char} text", char * 3):
            assert is_plain(text) is printable, hex(code)
            assert is_plain_with_spaces(text) is spaced, hex(code)
    assert is_plain("") and is_plain_with_spaces("")
