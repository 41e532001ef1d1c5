"""Multi-output models (BGE-M3 layout): one encoder forward pass gives the dense vector (the folder's
Pooling, CLS for BGE-M3, normalized), SPLADE-like lexical weights from ``sparse_linear`` and ColBERT vectors
from ``colbert_linear``. The same served model answers ``/v1/embeddings`` (dense), the sparse route and
``/v1/score`` (ColBERT late interaction).

The heads are the files BGE-M3 publishes beside the encoder: ``sparse_linear.pt`` (Linear hidden → 1) and
``colbert_linear.pt`` (Linear hidden → d), or the same tensors as ``*.safetensors`` (the ONNX and
CTranslate2 converters write those, so the converted folder serves without torch). Formulas as in
FlagEmbedding's ``BGEM3FlagModel``:

- sparse: ``relu(sparse_linear(h_t))`` per token, the maximum per token id, special tokens (CLS, EOS, PAD,
  UNK) dropped, zeros dropped;
- ColBERT: ``normalize(colbert_linear(h_t))`` for every attended token but the first (CLS);
  score = mean over query vectors of the best dot product with the document's vectors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Mapping, Sequence

import numpy as np

from core.capabilities import Capability
from core.config import ModelSpec
from core.errors import InvalidInput
from core.loading import ModelInfo, read_embed_pipeline
from core.tasks.base import TextTask
from core.tasks.dense import load_safetensors, load_torch_state
from core.tasks.embed import EmbedRequest, EmbedResult
from core.tasks.late_interaction import MaxSimRequest
from core.tasks.prompts import resolve_prompt
from core.tasks.base import ScoreResult
from core.tasks.sparse import SparseResult, SparseVector
from core.tasks.vectors import l2_normalize, pool, shape_vectors
from core.tasks import chunking


def load_linear(folder: Path, name: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``name``.safetensors or ``name``.pt (a torch ``nn.Linear`` state dict): (weight (out, in), bias)."""
    folder = Path(folder)
    if (folder / f"{name}.safetensors").exists():
        state = load_safetensors(folder / f"{name}.safetensors")
    else:
        state = load_torch_state(folder / f"{name}.pt", written_by=f"{name}.safetensors")
    if "weight" not in state:
        raise InvalidInput(f"{folder}/{name}: no 'weight' tensor (has {sorted(state)})")
    bias = state.get("bias")
    return (np.ascontiguousarray(state["weight"], dtype=np.float32),
            None if bias is None else np.asarray(bias, dtype=np.float32))


@dataclass(slots=True)
class M3Item:
    ids: np.ndarray
    type_ids: np.ndarray
    want: str  # pooled | sparse | colbert
    text: int = 0  # a chunked text's index (its windows are pooled into one vector in ``finish``)

    @property
    def cost(self) -> int:
        return int(self.ids.shape[0])


@dataclass(slots=True)
class M3Output:
    pooled: np.ndarray | None = None
    sparse: SparseVector | None = None
    colbert: np.ndarray | None = None


class MultiOutputTask(TextTask):
    name: ClassVar[str] = "multi_output"
    head: ClassVar[str] = "encoder"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.EMBEDDINGS, Capability.EMBEDDINGS_SPARSE,
                                                               Capability.SCORE, Capability.TOKENIZE})
    chunks: ClassVar[bool] = True  # the dense output: windows of a long text pooled into one vector

    def __init__(self, info: ModelInfo, spec: ModelSpec):
        super().__init__(info, spec)
        self.spec = spec
        self.pipeline = read_embed_pipeline(info.folder, pooling=spec.pooling, dense_path=spec.dense_path)
        if self.pipeline.steps:
            raise InvalidInput(f"{info.folder}: Dense modules on a multi-output model are not supported")
        self.sparse_w, self.sparse_b = load_linear(info.folder, "sparse_linear")
        self.colbert_w, self.colbert_b = load_linear(info.folder, "colbert_linear")
        hidden = info.dimension or self.colbert_w.shape[1]
        if self.sparse_w.shape != (1, hidden) or self.colbert_w.shape[1] != hidden:
            raise InvalidInput(f"{info.folder}: head shapes sparse {self.sparse_w.shape}, colbert "
                               f"{self.colbert_w.shape} do not fit the encoder's hidden size {hidden}")
        self.dimension = hidden
        self.colbert_dimension = int(self.colbert_w.shape[0])
        tok = self.tokenizer
        self.unused_ids = frozenset(t for t in (tok.token_to_id(s) for s in (
            "[CLS]", "[SEP]", "[PAD]", "[UNK]", "<s>", "</s>", "<pad>", "<unk>")) if t is not None) | {tok.pad_id}

    def _encode(self, texts: Sequence[str], truncate: bool, want: str) -> list[M3Item]:
        return [M3Item(e.ids, e.type_ids, want) for e in self.tokenizer.encode(texts, truncate=truncate)]

    # worker thread
    def prepare(self, request: EmbedRequest | MaxSimRequest) -> list[M3Item]:
        if isinstance(request, MaxSimRequest):
            if not request.documents:
                raise InvalidInput("'documents' must not be empty", param="documents")
            return self._encode([request.query, *request.documents], request.truncate, "colbert")
        if request.late_chunking not in (None, False):
            raise InvalidInput("late_chunking is offered for single-vector text embedding models; this model's "
                               f"task is {self.name!r} (it offers chunking: one dense vector per text)",
                               param="late_chunking")
        want = "sparse" if request.output == "sparse" else "pooled"
        if request.dimensions is not None and request.dimensions > self.dimension:
            raise InvalidInput(f"dimensions={request.dimensions} exceeds the model's dimension {self.dimension}",
                               param="dimensions")
        request.chunking = chunking.in_force(self, request)
        if request.chunking is not None:
            if want != "pooled":
                raise InvalidInput("chunking applies to the dense output", param="chunking")
            return [M3Item(w.ids, w.type_ids, want, text=w.text) for w in chunking.prepare_chunked(self, request)]
        if request.token_ids is not None:
            return [M3Item(e.ids, e.type_ids, want)
                    for e in self.tokenizer.from_ids(request.token_ids, truncate=request.truncate)]
        prompt = resolve_prompt(self.info, self.spec, request.prompt, request.prompt_name)
        texts = [prompt + t for t in request.texts or []] if prompt else request.texts or []
        return self._encode(texts, request.truncate, want)

    # inference thread
    def postprocess(self, outputs: Mapping[str, np.ndarray], items: Sequence[M3Item]) -> list[M3Output]:
        hidden = outputs["last_hidden_state"]
        lengths = np.fromiter((it.cost for it in items), dtype=np.int64, count=len(items))
        mask = np.arange(hidden.shape[1])[None, :] < lengths[:, None]
        results = [M3Output() for _ in items]
        pooled_rows = [i for i, it in enumerate(items) if it.want == "pooled"]
        if pooled_rows:
            pooled = pool(hidden[pooled_rows], mask[pooled_rows], self.pipeline.pooling).astype(np.float32)
            for row, vec in zip(pooled_rows, pooled):
                results[row].pooled = vec
        for row, it in enumerate(items):
            h = hidden[row, : it.cost].astype(np.float32, copy=False)
            if it.want == "sparse":
                weights = np.maximum(h @ self.sparse_w[0] + (self.sparse_b[0] if self.sparse_b is not None else 0), 0)
                best: dict[int, float] = {}
                for tid, w in zip(it.ids.tolist(), weights.tolist()):
                    if tid in self.unused_ids or w <= 0:
                        continue
                    if w > best.get(tid, 0.0):
                        best[tid] = w
                idx = np.array(sorted(best), dtype=np.int64)
                results[row].sparse = SparseVector(idx, np.array([best[i] for i in idx.tolist()], dtype=np.float32))
            elif it.want == "colbert":
                vecs = h[1:] @ self.colbert_w.T
                if self.colbert_b is not None:
                    vecs += self.colbert_b
                results[row].colbert = np.ascontiguousarray(l2_normalize(vecs), dtype=np.float32)
        return results

    def finish(self, request, items: Sequence[M3Item], results: list[M3Output]):
        tokens = sum(it.cost for it in items)
        if isinstance(request, MaxSimRequest):
            query, docs = results[0].colbert, [r.colbert for r in results[1:]]
            return ScoreResult(np.asarray([colbert_score(query, d) for d in docs], dtype=np.float32), tokens)
        if items and items[0].want == "sparse":
            return SparseResult([r.sparse for r in results], tokens)
        vectors = np.stack([r.pooled for r in results]) if results else np.zeros((0, self.dimension), np.float32)
        vectors = self.shape(vectors, request)
        if request.chunking is not None:  # windows → one vector per text
            normalize = self.pipeline.normalize if request.normalize is None else request.normalize
            vectors = chunking.finish_chunked(request, items, vectors, normalize)
        return EmbedResult(vectors, tokens)

    def shape(self, vectors: np.ndarray, request: EmbedRequest) -> np.ndarray:
        normalize = self.pipeline.normalize if request.normalize is None else request.normalize
        return shape_vectors(vectors, request.dimensions, normalize)

    def token_strings(self, indices: np.ndarray) -> list[str]:
        return [self.tokenizer.id_to_token(int(i)) or "" for i in indices]

    def describe(self) -> dict:
        return {
            "task": self.name,
            "capabilities": sorted(self.capabilities),
            "dimension": self.dimension,
            "colbert_dimension": self.colbert_dimension,
            "max_length": self.info.max_length,
            "pooling": self.pipeline.pooling,
            "normalize": self.pipeline.normalize,
            "vocab_size": self.tokenizer.vocab_size,
        }


def colbert_score(query: np.ndarray, document: np.ndarray) -> float:
    """BGE-M3's ColBERT score: the mean over query vectors of their best dot product with the document's."""
    if query.shape[0] == 0 or document.shape[0] == 0:
        return 0.0
    return float((query @ document.T).max(axis=1).mean())
