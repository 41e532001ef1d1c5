"""Multi-vector (late interaction, ColBERT-style) text: one vector per token, scored with MaxSim.

Supported folder layout (PyLate / sentence-transformers): the encoder at the root (``config.json``,
``model.safetensors``, ``tokenizer.json``), ``modules.json`` listing a ``Dense`` module whose folder holds
``config.json`` (``in_features``, ``out_features``, ``bias``, ``activation_function``: any of
``core/tasks/dense.py``) and ``model.safetensors`` (or ``pytorch_model.bin``) with ``linear.weight`` (and
``linear.bias``); any number of them. Another module type fails the load, naming it. ``config_sentence_transformers.json``
may set PyLate's ``query_prefix`` / ``document_prefix`` (a token inserted after the first special token),
``query_length`` / ``document_length``, ``do_query_expansion`` (pad queries with [MASK] to query_length,
not attended, their vectors kept), ``skiplist_words`` (document tokens dropped; default: punctuation).
A plain encoder folder (no Dense) serves its normalized token vectors (e.g. MiniLM with task
``late_interaction``).

Per input: token vectors → projection (where the model has one) → drop padding and, for documents,
skip-list tokens → L2-normalize. MaxSim(query, doc) = Σ over query vectors of the max dot product with the
document's vectors.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

import numpy as np

from core.capabilities import Capability
from core.config import ModelSpec
from core.errors import InvalidInput, TooLarge
from core.loading import DenseModule, ModelInfo, is_stanford_colbert, stanford_colbert_settings
from core.tasks.base import Task
from core.tasks.dense import DenseLayer
from core.tasks.embed import EmbedRequest, EmbedResult
from core.tasks.prompts import resolve_prompt
from core.tasks.base import ScoreResult
from core.tasks.vectors import l2_normalize
from core.tokenization import TextTokenizer
from core.tasks.chunking import refuse_long_input_options

QUERY_TYPES = frozenset({"query", "search_query"})
DOCUMENT_TYPES = frozenset({"document", "search_document", "passage"})


@dataclass(slots=True)
class MaxSimRequest:
    """``/v1/score``'s work: the MaxSim score of each document against the query, in input order."""

    query: str
    documents: list[str]
    truncate: bool = True


@dataclass(slots=True)
class TokenItem:
    ids: np.ndarray  # int64 (n,)
    attend: int  # leading positions the model attends to (the rest: query-expansion tokens)
    keep: np.ndarray  # bool (n,): positions whose vectors are returned

    @property
    def cost(self) -> int:
        return int(self.ids.shape[0])


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def load_projections(folder: Path) -> list[DenseLayer]:
    """The Dense modules of a sentence-transformers/PyLate folder, in module order (any activation of
    ``core/tasks/dense.py``). A module other than Transformer and Dense fails the load, naming it."""
    from core.errors import Unsupported

    modules = json.loads((folder / "modules.json").read_text()) if (folder / "modules.json").exists() else []
    out, pooled = [], False
    for module in sorted(modules, key=lambda m: int(m.get("idx", 0))):
        kind = str(module.get("type", ""))
        name = kind.rsplit(".", 1)[-1]
        where = f"{folder}: module {kind!r} ({module.get('path') or 'the folder root'})"
        known = kind.split(".")[0] in ("sentence_transformers", "pylate")
        # token vectors are the output: a Pooling is not used, a Normalize is what the task does anyway
        if known and name in ("Transformer", "Pooling", "Normalize"):
            pooled = pooled or name == "Pooling"
            continue
        if not known or name != "Dense":
            raise Unsupported(f"{where} is not implemented by Tessera's late_interaction task (it runs "
                              "Transformer and Dense modules)")
        if pooled:
            raise Unsupported(f"{where}: a Dense after Pooling projects the pooled vector, not token vectors")
        sub = folder / module.get("path", "")
        cfg = _read(sub / "config.json")
        try:
            spec = DenseModule(folder=sub, in_features=int(cfg["in_features"]), out_features=int(cfg["out_features"]),
                               bias=bool(cfg.get("bias", True)),
                               # PyLate's Dense defaults to Identity
                               activation=str(cfg.get("activation_function") or "torch.nn.modules.linear.Identity"),
                               use_residual=bool(cfg.get("use_residual", False)))
        except KeyError as exc:
            raise InvalidInput(f"{sub}/config.json lacks {exc.args[0]!r}") from exc
        out.append(DenseLayer.load(spec))
    return out


#: where the converters put a Stanford ColBERT checkpoint's projection beside a converted encoder (the
#: checkpoint itself keeps it in the encoder's weight file, which a converted folder does not carry)
STANFORD_PROJECTION_FILE = "linear.safetensors"


def load_stanford_projection(folder: Path) -> DenseLayer:
    """The ``linear.weight`` projection (no bias, no activation) of a Stanford ColBERT checkpoint: from the
    weight file it shares with the encoder (only that tensor is read from a safetensors file), else from
    ``linear.safetensors`` beside a converted encoder."""
    from core.tasks.dense import activation_for, load_torch_state

    for name in ("model.safetensors", STANFORD_PROJECTION_FILE):
        if (folder / name).exists():
            from safetensors import safe_open

            with safe_open(str(folder / name), framework="numpy") as f:
                if "linear.weight" in f.keys():
                    weight = f.get_tensor("linear.weight")
                    break
    else:
        if not (folder / "pytorch_model.bin").exists():
            raise InvalidInput(f"{folder}: a Stanford ColBERT checkpoint (HF_ColBERT) without its projection "
                               f"(linear.weight in model.safetensors, pytorch_model.bin or {STANFORD_PROJECTION_FILE})")
        state = load_torch_state(folder / "pytorch_model.bin", written_by=STANFORD_PROJECTION_FILE)
        if "linear.weight" not in state:
            raise InvalidInput(f"{folder}/pytorch_model.bin has no 'linear.weight' (the ColBERT projection)")
        weight = state["linear.weight"]
    identity = activation_for("torch.nn.modules.linear.Identity", folder)
    return DenseLayer(np.ascontiguousarray(weight, dtype=np.float32), None, identity, None, False)


def maxsim(query: np.ndarray, document: np.ndarray) -> float:
    if query.shape[0] == 0 or document.shape[0] == 0:
        return 0.0
    return float((query @ document.T).max(axis=1).sum())


class LateInteractionTask(Task):
    name: ClassVar[str] = "late_interaction"
    head: ClassVar[str] = "encoder"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.EMBEDDINGS, Capability.SCORE, Capability.TOKENIZE})
    fetches_inputs: ClassVar[bool] = False

    def __init__(self, info: ModelInfo, spec: ModelSpec):
        self.info = info
        self.spec = spec
        self.tokenizer = TextTokenizer(info.folder, info.max_length)
        if is_stanford_colbert(info.folder):
            self.projections = [load_stanford_projection(info.folder)]
            cfg = stanford_colbert_settings(info.folder)
        else:
            self.projections = load_projections(info.folder)
            cfg = _read(info.folder / "config_sentence_transformers.json")
        self.query_prefix = cfg.get("query_prefix")
        self.document_prefix = cfg.get("document_prefix")
        self.query_length = min(int(cfg.get("query_length") or info.max_length), info.max_length)
        self.document_length = min(int(cfg.get("document_length") or info.max_length), info.max_length)
        self.expand_queries = bool(cfg.get("do_query_expansion", False))
        #: PyLate's attend_to_expansion_tokens (ColBERT's attend_to_mask_tokens): the [MASK] expansions are attended
        self.attend_expansions = bool(cfg.get("attend_to_expansion_tokens", False))
        words = cfg.get("skiplist_words", list(string.punctuation))
        self.skip_ids = frozenset(
            tid for w in words if (tid := self.tokenizer.token_to_id(w)) is not None
        )
        self.mask_id = self.tokenizer.token_to_id("[MASK]")
        if self.expand_queries and self.mask_id is None:
            raise InvalidInput(f"{info.folder}: query expansion needs a [MASK] token")
        self.special_ids = self.tokenizer.special_ids
        self.dimension = self.projections[-1].weight.shape[0] if self.projections else info.dimension

    def check_backend(self, backend) -> None:
        """A backend that takes sequence lengths, not a mask (CTranslate2's encoder: ``masks_attention`` off)
        treats positions past a row's length as padding, so the vectors of [MASK] expansions that are kept but
        not attended (ColBERT's and PyLate's default) cannot be had from it (they came out different on the
        test checkpoints)."""
        if not backend.masks_attention and self.expand_queries and not self.attend_expansions:
            from core.errors import Unsupported

            raise Unsupported(
                f"model {self.spec.served_name!r}: its queries are padded with [MASK] tokens that are not attended "
                "but whose vectors are kept (ColBERT query expansion); CTranslate2's encoder runs only the "
                "attended positions, so it cannot compute them. Serve it with backend 'torch' or 'onnx'",
                code="unsupported_architecture")

    # tokenization ------------------------------------------------------------------------------
    def _items(self, texts: Sequence[str], *, is_query: bool, truncate: bool) -> list[TokenItem]:
        prefix = self.query_prefix if is_query else self.document_prefix
        limit = self.query_length if is_query else self.document_length
        prefix_id = self.tokenizer.token_to_id(prefix) if prefix else None
        if prefix and prefix_id is None:  # not a single token: prepend it as text
            texts = [prefix + t for t in texts]
        room = limit - (1 if prefix_id is not None else 0)
        # truncate=True caps at the model's max_length (>= room), the cut to room follows; truncate=False
        # refuses input over max_length here and over room below
        encoded = self.tokenizer.encode(texts, truncate=truncate)
        items = []
        for i, enc in enumerate(encoded):
            ids = enc.ids
            if ids.size > room:
                if not truncate:
                    raise TooLarge(
                        f"input[{i}] has {ids.size} tokens, more than this model's {room} "
                        f"for a {'query' if is_query else 'document'}; set truncate=true",
                        param="input", code="input_too_long",
                    )
                ids = np.concatenate([ids[: room - 1], ids[-1:]])  # keep the closing special token
            if prefix_id is not None:
                ids = np.concatenate([ids[:1], [prefix_id], ids[1:]]).astype(np.int64)
            attend = ids.size
            if is_query and self.expand_queries and ids.size < limit:
                ids = np.concatenate([ids, np.full(limit - ids.size, self.mask_id, np.int64)])
                if self.attend_expansions:
                    attend = ids.size
            if is_query:
                keep = np.ones(ids.size, dtype=bool)
            else:
                keep = np.fromiter((int(t) not in self.skip_ids for t in ids), dtype=bool, count=ids.size)
            items.append(TokenItem(ids.astype(np.int64), attend, keep))
        return items

    # the task contract -----------------------------------------------------------------------------
    def prepare(self, request: EmbedRequest | MaxSimRequest) -> list[TokenItem]:
        refuse_long_input_options(request, self.name)
        if isinstance(request, MaxSimRequest):
            if not request.documents:
                raise InvalidInput("'documents' must not be empty", param="documents")
            return (self._items([request.query], is_query=True, truncate=request.truncate)
                    + self._items(request.documents, is_query=False, truncate=request.truncate))
        if request.token_ids is not None:
            raise InvalidInput("late-interaction models take text input, not token ids", param="input")
        if request.dimensions is not None:
            raise InvalidInput("'dimensions' is not supported by multi-vector models", param="dimensions")
        kind = request.input_type or "document"
        if kind not in QUERY_TYPES | DOCUMENT_TYPES:
            raise InvalidInput(
                f"input_type must be one of {sorted(QUERY_TYPES | DOCUMENT_TYPES)}, got {kind!r}", param="input_type"
            )
        prompt = resolve_prompt(self.info, self.spec, request.prompt, request.prompt_name)
        texts = request.texts or []
        if prompt:
            texts = [prompt + t for t in texts]
        return self._items(texts, is_query=kind in QUERY_TYPES, truncate=request.truncate)

    def answer_values(self, request, items: Sequence[TokenItem]) -> int | None:
        """An embedding answers a vector per kept token; a score request, one score per document."""
        if isinstance(request, MaxSimRequest):
            return None
        return int(sum(int(it.keep.sum()) if it.keep is not None else it.cost for it in items)) * (self.dimension or 0)

    def collate(self, items: Sequence[TokenItem]) -> Mapping[str, np.ndarray]:
        longest = max(it.cost for it in items)
        n = len(items)
        ids = np.full((n, longest), self.tokenizer.pad_id, dtype=np.int64)
        mask = np.zeros((n, longest), dtype=np.int64)
        for row, it in enumerate(items):
            ids[row, : it.cost] = it.ids
            mask[row, : it.attend] = 1
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}

    def postprocess(self, outputs: Mapping[str, np.ndarray], items: Sequence[TokenItem]) -> list[np.ndarray]:
        hidden = outputs["last_hidden_state"]
        out = []
        for row, it in enumerate(items):
            vecs = hidden[row, : it.cost][it.keep].astype(np.float32)
            for projection in self.projections:
                vecs = projection(vecs)
            out.append(np.ascontiguousarray(l2_normalize(vecs), dtype=np.float32))
        return out

    def finish(self, request, items: Sequence[TokenItem], results: list[np.ndarray]):
        tokens = sum(it.attend for it in items)
        if isinstance(request, MaxSimRequest):
            query, docs = results[0], results[1:]
            return ScoreResult(np.asarray([maxsim(query, d) for d in docs], dtype=np.float32), tokens)
        return EmbedResult(list(results), tokens)

    def describe(self) -> dict:
        return {
            "task": self.name,
            "capabilities": sorted(self.capabilities),
            "dimension": self.dimension,
            "max_length": self.info.max_length,
            "multi_vector": True,
            "query_length": self.query_length,
            "document_length": self.document_length,
        }
