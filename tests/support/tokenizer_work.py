"""Count the work a ``core.tokenization.TextTokenizer`` does: every text handed to its underlying
``tokenizers.Tokenizer`` objects is recorded. Tests that a long input is tokenized once (or that a
refusal stops early) assert on these counts, which do not depend on how busy the machine is."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class TokenizerWork:
    texts: list[str] = field(default_factory=list)

    @property
    def chars(self) -> int:
        return sum(map(len, self.texts))

    def times(self, text: str) -> int:
        """How many times ``text`` itself was tokenized."""
        return sum(t == text for t in self.texts)


class _Counting:
    """A ``tokenizers.Tokenizer`` that records the texts of each ``encode_batch`` (and ``encode_batch_fast``)
    and delegates the rest."""

    def __init__(self, inner, work: TokenizerWork):
        self._inner = inner
        self._work = work

    def _recorded(self, texts) -> list:
        texts = list(texts)
        self._work.texts.extend(t if isinstance(t, str) else "".join(t) for t in texts)
        return texts

    def encode_batch(self, texts, *args, **kwargs):
        return self._inner.encode_batch(self._recorded(texts), *args, **kwargs)

    def encode_batch_fast(self, texts, *args, **kwargs):
        return self._inner.encode_batch_fast(self._recorded(texts), *args, **kwargs)

    def encode(self, text, *args, **kwargs):
        self._work.texts.append(text)
        return self._inner.encode(text, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


@contextmanager
def counting_tokenizer(tokenizer):
    """Within the block, count every text ``tokenizer`` (a ``TextTokenizer``) tokenizes; yields the
    :class:`TokenizerWork`. The real tokenizers do the work; they are put back afterwards."""
    work = TokenizerWork()
    tokenizer.untruncated  # noqa: B018 (built on first use: build them now, so that they are counted)
    tokenizer._left_truncating()
    saved = tokenizer._truncating, tokenizer._untruncated, tokenizer._left
    twins = dict(tokenizer._twins)
    if tokenizer._twin_of is not None:  # the plain-text twins (core.tokenization.ascii_twin)
        tokenizer._twins.update({key: _Counting(tokenizer._twin(key), work) for key in ("right", "left", "full")})
    tokenizer._truncating, tokenizer._untruncated, tokenizer._left = (_Counting(t, work) for t in saved)
    try:
        yield work
    finally:
        tokenizer._truncating, tokenizer._untruncated, tokenizer._left = saved
        tokenizer._twins.clear()
        tokenizer._twins.update(twins)
