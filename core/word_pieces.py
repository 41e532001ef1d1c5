"""The word pieces of plain texts from a memo of the words seen before.

A BERT-style tokenizer (``BertPreTokenizer``, a ``WordPiece`` model) cuts a plain text (printable ASCII,
``core.tokenization.is_plain``) into words at whitespace and at every ASCII punctuation character, and gives each
word the same pieces wherever it stands. So once a word's pieces are known, a text made of known words needs no
tokenizer call: its ids are its words' pieces one after the other, cut to the length the truncation keeps, between
the post-processor's special tokens (where they go is read from the library, by tokenizing two texts with them and
cutting them here). The library's call costs 12-20 µs for a 10-word text (its normalizer,
pre-tokenizer and ``Encoding`` object); this costs 2-3. A word seen for the first time is cut by the tokenizer's
own ``WordPiece`` model (``Model.tokenize``, ~3 µs) and kept.

Only texts none of the tokenizer's added tokens can match are taken (an added token such as ``[MASK]`` is
matched in the text before the pre-tokenizer cuts it); every other text, and every tokenizer of another kind, goes
to the library. ``tests/unit/test_word_pieces.py`` holds this to the library's ids.
"""

from __future__ import annotations

import json
import re
from typing import Sequence

#: a run of ASCII letters and digits (a word), or one ASCII punctuation character (a word of its own): what
#: ``BertPreTokenizer`` cuts printable ASCII into, the whitespace between them dropped
_WORDS = re.compile(r"[0-9A-Za-z]+|[!-/:-@\[-`{-~]")
#: at most this many words kept per tokenizer (4.7 MB for all-MiniLM-L6-v2's 21,745 alphabetic vocabulary words,
#: 7.7 MB for this many words of up to ``LONGEST_WORD`` random letters): past it, texts with new words go to the
#: library, so a stream of words never seen again (ids, hashes) cannot grow the memo
CAPACITY = 1 << 15
#: longer words are not kept (a text with one goes to the library)
LONGEST_WORD = 32


#: texts the library tokenizes with its special tokens, to read where it puts them around this module's own cuts
_PROBES = ("the", "the end, 2 more")


def _around(tokenizer) -> tuple[list[int], list[int]] | None:
    """The ids the tokenizer's post-processing puts before and after a single text's own tokens, read from the
    library itself, or None where its output for the probes is not this module's cut of them between the same two
    runs of ids."""

    def cut(text: str) -> list[int]:
        return [token.id for word in _WORDS.findall(text) for token in tokenizer.model.tokenize(word)]

    bare, whole = cut(_PROBES[0]), tokenizer.encode(_PROBES[0]).ids
    start = next((i for i in range(len(whole) - len(bare) + 1) if whole[i:i + len(bare)] == bare), None)
    if not bare or start is None:
        return None
    before, after = whole[:start], whole[start + len(bare):]
    return (before, after) if tokenizer.encode(_PROBES[1]).ids == before + cut(_PROBES[1]) + after else None


class WordPieces:
    """The memo of one tokenizer (``of`` says whether it has one). ``lowercase``: whether the tokenizer's
    normalizer lowercases plain text (the only change it may make to it: ``core.tokenization.ascii_twin``)."""

    def __init__(self, model, lowercase: bool, before: list[int], after: list[int], added: Sequence[str]):
        self._model = model
        #: one int object per id seen, shared by every word that holds it
        self._ints: dict[int, int] = {}
        self._lowercase = lowercase
        self._before = before
        self._after = after
        #: what an added token could match in a text, in any case: a text that holds none of them is cut into words
        #: by the pre-tokenizer alone (a case-sensitive match is found too)
        self._added = (re.compile("|".join(re.escape(a) for a in sorted(set(added)) if a), re.IGNORECASE)
                       if any(added) else None)
        self._words: dict[str, tuple[int, ...]] = {}
        #: special tokens a single text gets: the truncation keeps ``max_length`` minus these of its own tokens
        self.specials = len(before) + len(after)

    @classmethod
    def of(cls, tokenizer, lowercase: bool) -> "WordPieces | None":
        """The memo of a ``tokenizers.Tokenizer`` whose normalizer leaves plain text as it is but for its case, or
        None where its pre-tokenizer or model is not one whose cuts this module knows, or its post-processing does
        more than put the same ids around a text."""
        if tokenizer.pre_tokenizer is None or tokenizer.model is None:
            return None
        if json.loads(tokenizer.pre_tokenizer.__getstate__()).get("type") != "BertPreTokenizer":
            return None
        if json.loads(tokenizer.model.__getstate__()).get("type") != "WordPiece":
            return None
        around = _around(tokenizer)
        if around is None:
            return None
        added = [token.content for token in tokenizer.get_added_tokens_decoder().values()]
        return cls(tokenizer.model, lowercase, around[0], around[1], added)

    def encode(self, texts: Sequence[str], keep: int | None, left: bool = False) -> list[list[int] | None]:
        """Each plain text's ids, special tokens included, its own tokens cut to the first ``keep`` (the last
        ``keep`` when ``left``; all when None); None for a text that goes to the library (an added token may
        match in it, or it holds a word the memo does not keep)."""
        words = self._words
        find = _WORDS.findall
        added = self._added
        before, after = self._before, self._after
        out: list[list[int] | None] = []
        for text in texts:
            if self._lowercase:
                text = text.lower()
            if added is not None and added.search(text):
                out.append(None)
                continue
            ids: list[int] = []
            for word in find(text):
                pieces = words.get(word)
                if pieces is None:
                    pieces = self._learn(word)
                    if pieces is None:
                        ids = None
                        break
                ids += pieces
            if ids is None:
                out.append(None)
                continue
            if keep is not None and len(ids) > keep:
                ids = ids[-keep:] if left else ids[:keep]
            out.append([*before, *ids, *after] if before or after else ids)
        return out

    def _learn(self, word: str) -> tuple[int, ...] | None:
        if len(word) > LONGEST_WORD or len(self._words) >= CAPACITY:
            return None
        share = self._ints.setdefault
        pieces = self._words[word] = tuple(share(token.id, token.id) for token in self._model.tokenize(word))
        return pieces
