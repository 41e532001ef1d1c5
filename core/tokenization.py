"""Fast tokenization with the Rust ``tokenizers`` library (no transformers import, so the ONNX path
starts fast). Truncation and padding are ours: the folder's tokenizer.json settings are reset."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from itertools import accumulate, chain
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from core.errors import InvalidInput, TooLarge
from core.word_pieces import WordPieces


@dataclass(slots=True)
class Encoded:
    """One tokenized input: what the batcher costs and the collator pads."""

    ids: np.ndarray  # int64 (n,)
    type_ids: np.ndarray  # int64 (n,)
    #: leading tokens left out of pooling (a prompt, when the model's Pooling has include_prompt=false)
    pool_from: int = 0
    #: embedding tasks: return every token's vector (TEI's /embed_all) instead of the pooled one
    all_tokens: bool = False

    @property
    def cost(self) -> int:
        return int(self.ids.shape[0])


#: a token covers at least one byte of UTF-8, so a text has at most 4 tokens per character (before
#: special tokens): texts short enough by this bound need no tokenization to know they fit
MAX_TOKENS_PER_CHAR = 4


def unencodable(texts: Sequence[str], param: str = "input") -> InvalidInput | None:
    """The error for the first text that is not valid Unicode (a lone surrogate such as JSON's
    ``"\\ud800"``, which no tokenizer can encode), or None."""
    for i, text in enumerate(texts):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            return InvalidInput(
                f"{param}[{i}] is not valid Unicode text: {exc.reason} at character {exc.start}",
                param=param, code="invalid_text",
            )
    return None


def set_parallelism(enabled: bool) -> None:
    """The tokenizers library's threads inside one call (``settings.tokenizer_parallelism``): the library
    reads its ``TOKENIZERS_PARALLELISM`` variable at every call, so this process's environment is where the
    setting goes; called where the settings reach the models (``Registry.from_settings``, a front end's
    ``remote_registry``, an executor's start)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if enabled else "false"


def _fast(tokenizer):
    """``encode_batch_fast`` (tokenizers ≥ 0.21: no character offsets, which embedding never reads) where the
    library has it, else ``encode_batch``."""
    return getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)


def is_plain(text: str) -> bool:
    """Plain text for ``ascii_twin``: printable ASCII only. (``str.isascii`` reads a flag of the string, and
    ``isprintable`` is one pass in C: a text that is not plain costs next to nothing to turn away.)"""
    return text.isascii() and text.isprintable()


_SPACES = str.maketrans("\t\n\r", "   ")


def is_plain_with_spaces(text: str) -> bool:
    """Plain text for ``ascii_twin`` where tab, newline and carriage return are plain too."""
    return text.isascii() and (text.isprintable() or text.translate(_SPACES).isprintable())


#: normalizers that leave printable ASCII as it is
_KEEP_ASCII = frozenset({"NFC", "NFD", "NFKC", "NFKD", "StripAccents"})
#: pre-tokenizers that split at a tab, newline or carriage return as at a space
_SPLIT_AT_SPACES = frozenset({"BertPreTokenizer", "Whitespace", "WhitespaceSplit"})


def _on_ascii(spec: dict) -> tuple[bool, bool] | None:
    """What a normalizer (its tokenizer.json entry) does to plain text: (lowercases it, turns tab, newline and
    carriage return into spaces), or None where it may do anything else (``Replace``, ``Precompiled``, ...)."""
    kind = spec.get("type")
    if kind == "BertNormalizer":  # accents, Chinese characters and control characters: none in plain text
        return bool(spec.get("lowercase", True)), bool(spec.get("clean_text", True))
    if kind == "Lowercase":
        return True, False
    if kind in _KEEP_ASCII:
        return False, False
    if kind == "Sequence":
        lower = spaces = False
        for part in spec.get("normalizers") or ():
            effect = _on_ascii(part)
            if effect is None:
                return None
            lower, spaces = lower or effect[0], spaces or effect[1]
        return lower, spaces
    return None


def ascii_twin(tokenizer) -> tuple[bool, Callable[[str], bool]] | None:
    """How a copy of ``tokenizer`` tokenizes plain texts to the same tokens for less work: (lowercase, which texts
    it may take: ``is_plain`` or ``is_plain_with_spaces``), or None where the tokenizer has no cheaper twin. The
    twin's normalizer is a bare ``Lowercase`` (or none): ``BertNormalizer``'s per-character pass (accents,
    Chinese characters, control characters, with the alignments it keeps) changes nothing in printable ASCII
    but its case, and it is half of a short text's tokenization (17.5 against 11.7 µs a text, all-MiniLM-L6-v2's
    tokenizer, 47-character texts). Tab, newline and carriage return are plain too where the normalizer keeps
    them, or where it makes them spaces and the pre-tokenizer splits at them as at a space (no added token
    matched after normalization holds a space)."""
    if tokenizer.normalizer is None:
        return None
    spec = json.loads(tokenizer.normalizer.__getstate__())
    effect = _on_ascii(spec)
    if effect is None or spec.get("type") == "Lowercase" or spec.get("type") in _KEEP_ASCII:
        return None  # unknown, or as cheap as its twin would be
    lower, spaces = effect
    plain = is_plain_with_spaces
    if spaces:
        pre = json.loads(tokenizer.pre_tokenizer.__getstate__()) if tokenizer.pre_tokenizer is not None else {}
        spaced = any(tok.normalized and any(c.isspace() for c in tok.content)
                     for tok in tokenizer.get_added_tokens_decoder().values())
        if pre.get("type") not in _SPLIT_AT_SPACES or spaced:
            plain = is_plain
    return lower, plain


#: post-processors that give every token of a single text type id 0
_ZERO_TYPE_PROCESSORS = frozenset({"BertProcessing", "RobertaProcessing", "ByteLevel"})


def zero_type_ids(tokenizer) -> bool:
    """Every token of a single text gets type id 0 from ``tokenizer`` (no post-processor; BERT's, RoBERTa's or
    the byte-level one; a template whose single-text pieces all say 0; a sequence of those): then a text's
    type ids need not be read from its encoding, which costs as much as reading its ids."""
    processor = tokenizer.post_processor
    return processor is None or _zero_types(json.loads(processor.__getstate__()))


def _zero_types(spec: dict) -> bool:
    kind = spec.get("type")
    if kind in _ZERO_TYPE_PROCESSORS:
        return True
    if kind == "TemplateProcessing":
        return all(piece.get("type_id", 0) == 0 for entry in spec.get("single", []) for piece in entry.values())
    if kind == "Sequence":
        return all(_zero_types(part) for part in spec.get("processors", []))
    return False


#: from this many encodings in a call, their ids are read into one array (fewer: an array each is quicker)
FLAT_FROM = 8


def _ids(encoding) -> list[int]:
    """The ids of an encoding, or the ids themselves (a list: ``core.word_pieces``)."""
    return encoding if encoding.__class__ is list else encoding.ids


def as_encoded(encodings: Sequence, zero_types: bool = False) -> list["Encoded"]:
    """``Encoded`` items of ``tokenizers`` encodings (or of lists of ids, where ``zero_types``), their type ids
    zeros when ``zero_types``. From ``FLAT_FROM`` encodings on, their ids (and type ids) are read into one array
    each and every item is a view of its span: 0.9 against 1.6-2.2 µs a text at 32 texts; below that an array
    each is quicker (1.6 against 2.8 µs at one)."""
    if len(encodings) < FLAT_FROM:
        return [Encoded(np.asarray(_ids(e), dtype=np.int64),
                        np.zeros(len(e), dtype=np.int64) if zero_types else np.asarray(e.type_ids, dtype=np.int64))
                for e in encodings]
    ids = [_ids(e) for e in encodings]
    ends = list(accumulate(map(len, ids)))
    total = ends[-1]
    flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=total)
    types = (np.zeros(total, dtype=np.int64) if zero_types
             else np.fromiter(chain.from_iterable(e.type_ids for e in encodings), dtype=np.int64, count=total))
    return [Encoded(flat[start:end], types[start:end]) for start, end in zip([0, *ends], ends)]


def _guarded(encode, texts: Sequence[str], param: str, **kwargs):
    """Run a tokenizer call; if it refuses a text as not a string (a lone surrogate), say which (400)."""
    try:
        return encode(texts, **kwargs)
    except TypeError:
        error = unencodable(texts, param)
        if error is None:
            raise
        raise error from None


class TextTokenizer:
    def __init__(self, folder: Path, max_length: int, *, twin: bool = True, memo: bool = True):
        """``twin=False``: every text through the folder's own tokenizer (``ascii_twin``; a benchmark's
        before); ``memo=False``: plain texts through the twin, not the memo of their words' pieces."""
        path = Path(folder) / "tokenizer.json"
        if not path.exists():
            raise InvalidInput(f"{folder} has no tokenizer.json (a fast tokenizer is required)")
        self.max_length = max_length
        self._path = path
        self._truncating = self._made("right")
        # without truncation (long inputs refused or chunked, pairs, prompts, decoding) and truncating from
        # the start: made on first use, since a plain embedding request needs neither, and reading
        # tokenizer.json again costs start-up time (a Lambda cold start)
        self._untruncated = None
        self._left = None
        # the plain-text twins of the three (``ascii_twin``), made on first use, by truncation
        self._twin_of = ascii_twin(self._truncating) if twin else None
        self._twins: dict[str, object] = {}
        self._twins_lock = threading.Lock()
        self.vocab_size = self._truncating.get_vocab_size(with_added_tokens=True)
        self._zero_types = zero_type_ids(self._truncating)
        # plain texts' ids from their words' pieces, kept once cut (the twin's normalizer: the same cuts)
        found = (WordPieces.of(self._truncating, lowercase=self._twin_of[0])
                 if self._twin_of is not None and self._zero_types and memo else None)
        self._memo = found if found is not None and max_length > found.specials else None
        self.pad_id = self._pad_id(folder)

    def _made(self, truncation: str, lowercase: bool | None = None):
        """A ``tokenizers.Tokenizer`` of the folder, unpadded, truncating from the ``right`` or ``left`` or not
        at all (``full``); with ``lowercase`` set, the plain-text twin (its normalizer ``Lowercase`` or none)."""
        from tokenizers import Tokenizer, normalizers

        tokenizer = Tokenizer.from_file(str(self._path))
        tokenizer.no_padding()
        if truncation == "full":
            tokenizer.no_truncation()
        else:
            tokenizer.enable_truncation(self.max_length, direction=truncation)
        if lowercase is not None:
            tokenizer.normalizer = normalizers.Lowercase() if lowercase else None
        return tokenizer

    @property
    def _full(self):
        if self._untruncated is None:
            self._untruncated = self._made("full")
        return self._untruncated

    def _twin(self, truncation: str):
        twin = self._twins.get(truncation)
        if twin is None:
            with self._twins_lock:
                twin = self._twins.get(truncation)
                if twin is None:
                    twin = self._twins[truncation] = self._made(truncation, lowercase=self._twin_of[0])
        return twin

    def _encode(self, tokenizer, truncation: str, texts: list[str], param: str) -> list:
        """``tokenizer``'s encodings of ``texts`` (no offsets), or their ids (a list) where the memo gives them; the
        plain ones through the memo or the twin where the tokenizer has them."""
        if self._twin_of is None:
            return _guarded(_fast(tokenizer), texts, param)
        plain = self._twin_of[1]
        if plain("".join(texts)):  # every text plain (one pass over them all)
            return self._plain(truncation, texts)
        simple: list[int] = []
        rest: list[int] = []
        for i, text in enumerate(texts):
            (simple if plain(text) else rest).append(i)
        if not simple:
            return _guarded(_fast(tokenizer), texts, param)
        out: list = [None] * len(texts)
        for i, enc in zip(simple, self._plain(truncation, [texts[i] for i in simple])):
            out[i] = enc
        # a text that is not valid Unicode is among the rest: the error names its place in ``texts``
        for i, enc in zip(rest, _guarded(lambda _: _fast(tokenizer)([texts[i] for i in rest]), texts, param)):
            out[i] = enc
        return out

    def _plain(self, truncation: str, texts: list[str]) -> list:
        """Plain texts' ids from the memo (``core.word_pieces``), the encodings of the texts it leaves from the
        twin."""
        if self._memo is None:
            return _fast(self._twin(truncation))(texts)
        keep = None if truncation == "full" else self.max_length - self._memo.specials
        out = self._memo.encode(texts, keep, left=truncation == "left")
        missed = [i for i, ids in enumerate(out) if ids is None]
        if missed:
            for i, enc in zip(missed, _fast(self._twin(truncation))([texts[i] for i in missed])):
                out[i] = enc
        return out

    @property
    def untruncated(self):
        """The folder's ``tokenizers.Tokenizer`` without truncation or padding (chunking cuts its own windows)."""
        return self._full

    def _pad_id(self, folder: Path) -> int:
        import json

        cfg_path = Path(folder) / "config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        if cfg.get("pad_token_id") is not None:
            return int(cfg["pad_token_id"])
        for token in ("[PAD]", "<pad>", "<|endoftext|>"):
            tid = self._truncating.token_to_id(token)
            if tid is not None:
                return tid
        return 0

    def encode(self, texts: Sequence[str], *, truncate: bool = True, check_length: bool = True,
               param: str = "input", direction: str = "right") -> list[Encoded]:
        """Tokenize texts (with the model's special tokens). ``truncate=False`` refuses over-long input
        (unless ``check_length=False``: then it is returned whole); ``direction="left"`` keeps the end of
        an over-long text (the special tokens are added after the cut)."""
        if truncate and direction == "left":
            encodings = self._encode(self._left_truncating(), "left", list(texts), param)
        elif truncate:
            encodings = self._encode(self._truncating, "right", list(texts), param)
        else:
            encodings = self._encode(self._full, "full", list(texts), param)
            for i, enc in enumerate(encodings if check_length else ()):
                if len(enc) > self.max_length:
                    raise TooLarge(
                        f"input[{i}] has {len(enc)} tokens, more than the model's maximum of "
                        f"{self.max_length}; send shorter text or set truncate=true",
                        param="input", code="input_too_long",
                    )
        return as_encoded(encodings, self._zero_types)

    def _left_truncating(self):
        if self._left is None:
            self._left = self._made("left")
        return self._left

    def from_ids(self, sequences: Sequence[Sequence[int]], *, truncate: bool = True) -> list[Encoded]:
        """Token-id input, taken as the complete model input (special tokens included, as /v1/tokenize returns)."""
        out = []
        for i, seq in enumerate(sequences):
            try:
                ids = np.asarray(seq, dtype=np.int64)
            except (OverflowError, TypeError, ValueError):  # an id beyond int64, a float, a nested list
                raise InvalidInput(f"input[{i}]: token ids must be integers in [0, {self.vocab_size})",
                                   param="input", code="invalid_token_id") from None
            if ids.ndim != 1 or ids.size == 0:
                raise InvalidInput(f"input[{i}]: token ids must be a non-empty list of integers", param="input")
            if ids.min() < 0 or ids.max() >= self.vocab_size:
                raise InvalidInput(
                    f"input[{i}]: token ids must be in [0, {self.vocab_size}) for this model's tokenizer, got "
                    f"{int(ids.max()) if ids.max() >= self.vocab_size else int(ids.min())}. Ids from another "
                    "tokenizer (LangChain's OpenAIEmbeddings sends OpenAI's tiktoken ids by default) would embed "
                    "as garbage: send the text instead (OpenAIEmbeddings(check_embedding_ctx_length=False))",
                    param="input", code="invalid_token_id",
                )
            if ids.size > self.max_length:
                if not truncate:
                    raise TooLarge(
                        f"input[{i}] has {ids.size} tokens, more than the model's maximum of {self.max_length}",
                        param="input", code="input_too_long",
                    )
                ids = ids[: self.max_length]
            out.append(Encoded(ids, np.zeros_like(ids)))
        return out

    def pieces(self, texts: Sequence[str], *, add_special_tokens: bool = True,
               max_tokens: int | None = None) -> list[list[Piece]]:
        """Untruncated tokens with their ids, character offsets and special flags (``/v1/tokenize``).
        With ``max_tokens``, texts are tokenized a few at a time and the request is refused (413) as soon
        as the running total passes it, so the work and memory stay bounded whatever the input."""
        texts = list(texts)
        encodings: list = []
        total, step = 0, 32
        for start in range(0, len(texts), step):
            chunk = _guarded(self._full.encode_batch, texts[start : start + step], "input",
                             add_special_tokens=add_special_tokens)
            total += sum(len(e.ids) for e in chunk)
            if max_tokens is not None and total > max_tokens:
                raise TooLarge(f"the texts hold more than {max_tokens} tokens (max_tokens_per_request)",
                               param="input", code="too_many_tokens")
            encodings.extend(chunk)
        return [
            [Piece(i, t, bool(s), a, b) for i, t, s, (a, b) in zip(e.ids, e.tokens, e.special_tokens_mask, e.offsets)]
            for e in encodings
        ]

    def decode(self, sequences: Sequence[Sequence[int]], *, skip_special_tokens: bool = True) -> list[str]:
        """Text of token-id sequences (TEI's ``/decode``); ids outside the vocabulary are refused."""
        for i, seq in enumerate(sequences):
            bad = [t for t in seq if not 0 <= t < self.vocab_size]
            if bad:
                raise InvalidInput(f"ids[{i}]: token ids must be in [0, {self.vocab_size}), got {bad[:3]}",
                                   param="ids", code="invalid_token_id")
        return self._full.decode_batch([list(s) for s in sequences], skip_special_tokens=skip_special_tokens)

    def prompt_length(self, prompt: str) -> int:
        """Tokens a prompt occupies at the start of ``prompt + text``, as sentence-transformers counts them:
        the prompt tokenized alone with special tokens, less a trailing special token."""
        enc = _guarded(self._full.encode_batch, [prompt], "prompt")[0]
        n = len(enc.ids)
        if n and enc.special_tokens_mask[-1]:
            n -= 1
        return n

    def encode_pairs(
        self, pairs: Sequence[tuple[str, str]], *, truncate: bool = True, max_second: int | None = None
    ) -> list[Encoded]:
        """Tokenize (query, document) pairs for a cross-encoder. Over-long pairs lose document tokens first,
        then query tokens; ``truncate=False`` refuses them instead. ``max_second`` first clips every document
        to that many tokens (Cohere's ``max_tokens_per_doc``)."""
        if not pairs:
            return []
        specials = self._full.num_special_tokens_to_add(True)
        budget = self.max_length - specials
        bounded = {q: self._bounded_first(q, budget, truncate) for q in dict.fromkeys(q for q, _ in pairs)}
        firsts = _guarded(self._full.encode_batch, [bounded[q] for q, _ in pairs], "query", add_special_tokens=False)
        seconds = _guarded(self._full.encode_batch, [d for _, d in pairs], "documents", add_special_tokens=False)
        processed = []
        for i, (a, b) in enumerate(zip(firsts, seconds)):
            if max_second is not None and len(b.ids) > max_second:
                b.truncate(max_second)
            over = len(a.ids) + len(b.ids) - budget
            if over > 0:
                if not truncate:
                    raise TooLarge(
                        f"pair {i} has {len(a.ids) + len(b.ids) + specials} tokens, more than the model's maximum "
                        f"of {self.max_length}; send shorter text or set truncate=true",
                        param="documents", code="input_too_long",
                    )
                keep_b = max(len(b.ids) - over, 0)
                over -= len(b.ids) - keep_b
                b.truncate(keep_b)
                if over > 0:
                    a.truncate(max(len(a.ids) - over, 0))
            processed.append(self._full.post_process(a, b, add_special_tokens=True))
        return as_encoded(processed)

    def _bounded_first(self, text: str, budget: int, truncate: bool) -> str:
        """A pair's first text (the query, shared by every document) cut once to what any pair can keep,
        before pairing: a long query is tokenized once, not once per document, and no pair holds more
        than the model's length of it."""
        if MAX_TOKENS_PER_CHAR * len(text) <= budget:  # too short to be over: not tokenized an extra time
            return text
        enc = _guarded(self._full.encode_batch, [text], "query", add_special_tokens=False)[0]
        if len(enc.ids) <= budget:
            return text
        if not truncate:
            raise TooLarge(
                f"the query has {len(enc.ids)} tokens, more than the model's maximum of {self.max_length}; "
                "send a shorter query or set truncate=true", param="query", code="input_too_long",
            )
        return text[: enc.offsets[budget - 1][1]]

    def id_to_token(self, token_id: int) -> str | None:
        return self._full.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        return self._full.token_to_id(token)

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(
            tid for tid, tok in self._full.get_added_tokens_decoder().items() if getattr(tok, "special", False)
        )


@dataclass(slots=True, frozen=True)
class Piece:
    id: int
    text: str
    special: bool
    start: int
    stop: int


#: from this many rows on, ``pad_batch`` fills its arrays with masked assignments (below, row copies cost less)
PAD_ROWS_VECTORIZED = 8


def pad_batch(items: Sequence[Encoded], pad_id: int, multiple_of: int = 1) -> dict[str, np.ndarray]:
    """Right-pad to the batch's own longest item (rounded up to ``multiple_of``). A batch of a few rows is
    copied row by row; a larger one with one masked assignment per array (the rows' tokens concatenated fill
    the mask's places in row order: at 32 rows half the time of the row copies, at 1,024 a third)."""
    n = len(items)
    lengths = [item.ids.shape[0] for item in items]
    longest = max(lengths)
    if multiple_of > 1:
        longest = -(-longest // multiple_of) * multiple_of
    input_ids = np.full((n, longest), pad_id, dtype=np.int64)
    type_ids = np.zeros((n, longest), dtype=np.int64)
    if n < PAD_ROWS_VECTORIZED:
        attention = np.zeros((n, longest), dtype=np.int64)
        for row, (item, k) in enumerate(zip(items, lengths)):
            input_ids[row, :k] = item.ids
            type_ids[row, :k] = item.type_ids
            attention[row, :k] = 1
    else:
        mask = np.arange(longest)[None, :] < np.array(lengths)[:, None]
        input_ids[mask] = np.concatenate([item.ids for item in items])
        type_ids[mask] = np.concatenate([item.type_ids for item in items])
        attention = mask.astype(np.int64)
    return {"input_ids": input_ids, "attention_mask": attention, "token_type_ids": type_ids}
