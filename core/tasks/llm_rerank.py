"""Reranking with a causal LM (Qwen3-Reranker layout): each (query, document) pair is written into the
model's prompt template, and the score is read from the logits of the next token: P("yes") =
softmax([logit("no"), logit("yes")])[1] = sigmoid(logit("yes") - logit("no")), as the published usage
computes it; ``raw_scores`` returns the log-odds ``logit("yes") - logit("no")`` (sentence-transformers'
``LogitScore``).

The template (Qwen3-Reranker's model card): ``PREFIX + "<Instruct>: {instruction}\\n<Query>: {query}\\n
<Document>: {document}" + SUFFIX``, the middle part tokenized alone and cut to what the model's length leaves
after prefix and suffix (the document's tail goes first); the suffix, which ends where the model answers,
is never cut. Batches are padded on the left, so every row's last position is its own last token."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

import numpy as np

from core.capabilities import Capability
from core.config import ModelSpec
from core.errors import InvalidInput, TooLarge, Unsupported
from core.loading import ModelInfo, is_causal_lm, logit_score_config
from core.tasks.base import TextTask
from core.tasks.prompts import resolve_prompt
from core.tasks.rerank import RerankRequest
from core.tasks.activations import sigmoid
from core.tasks.base import ScoreResult
from core.tokenization import MAX_TOKENS_PER_CHAR, Encoded, unencodable

log = logging.getLogger(__name__)

#: Qwen3-Reranker's prompt, as its model card writes it
PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
          "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


def body(instruction: str, query: str, document: str) -> str:
    """The part of the prompt between prefix and suffix (the model card's ``format_instruction``)."""
    return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"


def _chat_template(folder: Path) -> str | None:
    path = folder / "chat_template.jinja"
    if path.exists():
        return path.read_text()
    tok_cfg_path = folder / "tokenizer_config.json"
    template = json.loads(tok_cfg_path.read_text()).get("chat_template") if tok_cfg_path.exists() else None
    if isinstance(template, list):  # named templates: [{"name": "default", "template": "…"}, …]
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def check_chat_template(folder: Path) -> None:
    """A sentence-transformers LogitScore folder formats pairs with its chat template (roles ``system`` for the
    instruction, ``query``, ``document``): it must render Qwen3-Reranker's prompt, which this task writes
    itself; any other template would give different scores, so the folder is refused (``Unsupported``)."""
    template = _chat_template(folder)
    if template is None:
        raise Unsupported(f"{folder}: a LogitScore reranker without a chat template; Tessera serves the "
                          "Qwen3-Reranker prompt layout (see docs/models.md)")
    marks = ("\x01I\x01", "\x01Q\x01", "\x01D\x01")
    expected = PREFIX + body(*marks) + SUFFIX
    try:
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:  # no jinja2 (a slim ONNX image): check the template's literal pieces instead
        pieces = (PREFIX.split("<|im_end|>")[0].split("\n", 1)[1], "<Instruct>: ", "\n<Query>: ", "\n<Document>: ",
                  "<|im_start|>assistant\n<think>\n\n</think>")
        rendered = None
        ok = all(p in template for p in pieces)
    else:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        messages = [{"role": "system", "content": marks[0]}, {"role": "query", "content": marks[1]},
                    {"role": "document", "content": marks[2]}]
        try:
            rendered = env.from_string(template).render(messages=messages, add_generation_prompt=True)
        except Exception as exc:  # a template that cannot render this pair is refused with its reason
            rendered = f"<error: {exc}>"
        ok = rendered == expected
    if not ok:
        raise Unsupported(f"{folder}: its chat template does not render the Qwen3-Reranker prompt "
                          f"(rendered {rendered!r}); other LLM-reranker prompt layouts are not implemented")


class LlmRerankTask(TextTask):
    name: ClassVar[str] = "rerank"
    head: ClassVar[str] = "causal-lm"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.RERANK, Capability.TOKENIZE})

    def __init__(self, info: ModelInfo, spec: ModelSpec):
        if not is_causal_lm(info):
            raise InvalidInput(f"{info.folder}: an LLM reranker needs a causal LM (*ForCausalLM), this folder "
                               f"holds {list(info.architectures)}")
        super().__init__(info, spec)
        from tokenizers import Tokenizer

        self.info, self.spec = info, spec
        self._tok = Tokenizer.from_file(str(info.folder / "tokenizer.json"))
        self._tok.no_padding()
        self._tok.no_truncation()
        score_cfg = logit_score_config(info.folder)
        if score_cfg is not None:
            check_chat_template(info.folder)
            self.true_id = score_cfg.get("true_token_id")
            self.false_id = score_cfg.get("false_token_id")
        else:
            self.true_id, self.false_id = self._tok.token_to_id("yes"), self._tok.token_to_id("no")
        if self.true_id is None or (score_cfg is None and self.false_id is None):
            raise InvalidInput(f"{info.folder}: the tokenizer has no 'yes'/'no' tokens, which an LLM reranker "
                               "scores by")
        vocab = int(info.config.get("vocab_size") or self._tok.get_vocab_size(with_added_tokens=True))
        for tid in (self.true_id, self.false_id):
            if tid is not None and not 0 <= int(tid) < vocab:
                raise InvalidInput(f"{info.folder}: score token id {tid} is outside the vocabulary ({vocab})")
        self.prefix = self._ids(PREFIX)
        self.suffix = self._ids(SUFFIX)
        self.budget = info.max_length - len(self.prefix) - len(self.suffix)
        if self.budget <= 0:
            raise InvalidInput(f"{info.folder}: max_length {info.max_length} leaves no room for the prompt "
                               f"({len(self.prefix) + len(self.suffix)} template tokens)")
        self.default_instruction = resolve_prompt(info, spec, None, None) or DEFAULT_INSTRUCTION

    def _ids(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    def _encode(self, texts: list[str], request: RerankRequest):
        try:
            return self._tok.encode_batch(texts, add_special_tokens=False)
        except TypeError:  # a lone surrogate: say which input
            for param, values in (("query", [request.query]), ("documents", request.documents),
                                  ("instruction", [request.instruction or ""])):
                error = unencodable(values, param)
                if error is not None:
                    raise error from None
            raise

    # worker thread
    def prepare(self, request: RerankRequest) -> list[Encoded]:
        if not request.documents:
            raise InvalidInput("'documents' must not be empty", param="documents")
        instruction = self.default_instruction if request.instruction is None else request.instruction
        documents = list(request.documents)
        if request.max_tokens_per_doc is not None:  # Cohere: each document clipped to N tokens first
            n = request.max_tokens_per_doc
            for i, enc in enumerate(self._encode(documents, request)):
                if len(enc.ids) > n:
                    documents[i] = documents[i][: enc.offsets[n - 1][1]]
        query = self._bounded_query(instruction, request)
        encodings = self._encode([body(instruction, query, d) for d in documents], request)
        items = []
        for i, enc in enumerate(encodings):
            ids = enc.ids
            if len(ids) > self.budget:
                if not request.truncate:
                    raise TooLarge(
                        f"pair {i} has {len(ids) + len(self.prefix) + len(self.suffix)} tokens with the prompt "
                        f"template, more than the model's maximum of {self.info.max_length}; send shorter text "
                        "or set truncate=true", param="documents", code="input_too_long",
                    )
                ids = ids[: self.budget]
            full = np.concatenate([self.prefix, np.asarray(ids, dtype=np.int64), self.suffix])
            items.append(Encoded(full, np.zeros_like(full)))
        return items

    #: tokens kept past the window when a long query is cut before pairing (only the last word's tokens
    #: can differ once the text after it changes)
    QUERY_MARGIN = 8

    def _bounded_query(self, instruction: str, request: RerankRequest) -> str:
        """A query (shared by every pair) that alone fills the window is cut once, before pairing, to what a
        pair can keep: a long query is tokenized once, not once per document, and each pair's tokens are
        the same as with the whole query (the window ends inside the query either way)."""
        query = request.query
        if MAX_TOKENS_PER_CHAR * (len(instruction) + len(query)) <= self.budget:  # too short to fill it
            return query
        head = body(instruction, query, "").rsplit("\n", 1)[0]  # "<Instruct>: …\n<Query>: …"
        (enc,) = self._encode([head], request)
        if len(enc.ids) <= self.budget:
            return query
        if not request.truncate:
            raise TooLarge(f"the query with the prompt template has more than {self.info.max_length} tokens, the "
                           "model's maximum; send a shorter query or set truncate=true", param="query",
                           code="input_too_long")
        end = enc.offsets[min(len(enc.ids), self.budget + self.QUERY_MARGIN) - 1][1]
        return query[: max(0, end - (len(head) - len(query)))]

    # inference thread
    def collate(self, items: Sequence[Encoded]) -> Mapping[str, np.ndarray]:
        """Left padding (as the model card's tokenizer): the next-token logits are read at the last position."""
        longest = max(item.cost for item in items)
        if self.pad_multiple > 1:
            longest = -(-longest // self.pad_multiple) * self.pad_multiple
        input_ids = np.full((len(items), longest), self.tokenizer.pad_id, dtype=np.int64)
        mask = np.zeros((len(items), longest), dtype=np.int64)
        for row, item in enumerate(items):
            input_ids[row, longest - item.cost:] = item.ids
            mask[row, longest - item.cost:] = 1
        return {"input_ids": input_ids, "attention_mask": mask}

    def postprocess(self, outputs: Mapping[str, np.ndarray], items: Sequence[Encoded]) -> list[float]:
        logits = outputs["next_token_logits"]
        yes = logits[:, self.true_id].astype(np.float64)
        no = logits[:, self.false_id].astype(np.float64) if self.false_id is not None else 0.0
        return [float(x) for x in yes - no]  # log-odds of "yes"

    def finish(self, request: RerankRequest, items: Sequence[Encoded], results: list[float]) -> ScoreResult:
        log_odds = np.asarray(results, dtype=np.float64)
        scores = log_odds.astype(np.float32) if request.raw_scores else sigmoid(log_odds)
        return ScoreResult(scores, sum(it.cost for it in items))

    def score_labels(self) -> list[str]:
        """The score is the probability of the "yes" token (the causal LM's config carries no labels of its own)."""
        return [self._tok.id_to_token(int(self.true_id)) or "yes"]

    def describe(self) -> dict:
        return {
            "task": self.name,
            "capabilities": sorted(self.capabilities),
            "max_length": self.info.max_length,
            "layout": "causal-lm",
            "score_tokens": {"true": self.true_id, "false": self.false_id},
            "instruction": self.default_instruction,
        }
