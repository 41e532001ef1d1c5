"""Stanford ColBERT checkpoints (the ``HF_ColBERT`` layout of colbert-ir/colbertv2.0 and
answerai-colbert-small-v1) beside PyLate's: detected as late interaction, settings from ``artifact.metadata``,
the projection ``linear.weight`` from the encoder's own weight file. Query vectors, document vectors and MaxSim
scores against ColBERT's recipe written out from its source (QueryTokenizer / DocTokenizer / ``ColBERT.query``
/ ``ColBERT.doc``) with transformers, on torch, on the ONNX graph our exporter writes and on CTranslate2."""

from __future__ import annotations

import importlib.util
import json
import string
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.loading import detect_task, read_model_info
from core.tasks.embed import EmbedRequest
from core.tasks.late_interaction import MaxSimRequest
from tests.support import family_models, text_models
from tests.support.cache import CT2_SOURCES, ONNX_EXPORT_SOURCES, cached_build
from tests.support.sentences import DOCS, LONG, QUERY, SENTENCES

SOURCES = [Path(family_models.__file__), Path(text_models.__file__)]
VARIANTS = list(family_models.STANFORD_COLBERTS)
BACKENDS = {"torch": "torch", "onnx": "onnxruntime", "ct2": "ctranslate2"}
#: the documents: the rerank set, and test sentences long enough to be cut at doc_maxlen
TEXTS = [d for d in DOCS if d] + list(SENTENCES[:12]) + [LONG]


class ColBERTReference:
    """ColBERT's (stanford-futuredata/ColBERT) encoding, written out with transformers and torch."""

    def __init__(self, folder: Path):
        import torch
        from transformers import BertModel, BertTokenizerFast

        self.torch = torch
        self.meta = json.loads((folder / "artifact.metadata").read_text())
        self.tok = BertTokenizerFast.from_pretrained(str(folder))
        self.bert = BertModel.from_pretrained(str(folder)).eval()
        if (folder / "model.safetensors").exists():
            from safetensors.torch import load_file

            state = load_file(str(folder / "model.safetensors"))
        else:
            state = torch.load(str(folder / "pytorch_model.bin"), weights_only=True)
        self.linear = state["linear.weight"]
        self.skiplist = {self.tok.encode(s, add_special_tokens=False)[0] for s in string.punctuation}

    def _forward(self, ids, mask):
        with self.torch.inference_mode():
            hidden = self.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        return hidden @ self.linear.T

    def queries(self, texts: list[str]) -> list[np.ndarray]:
        torch, tok = self.torch, self.tok
        enc = tok([". " + t for t in texts], padding="max_length", truncation=True, return_tensors="pt",
                  max_length=self.meta["query_maxlen"])
        ids, mask = enc["input_ids"], enc["attention_mask"]
        ids[:, 1] = tok.convert_tokens_to_ids(self.meta["query_token_id"])
        ids[ids == tok.pad_token_id] = tok.mask_token_id
        if self.meta["attend_to_mask_tokens"]:
            mask[ids == tok.mask_token_id] = 1
        q = torch.nn.functional.normalize(self._forward(ids, mask), p=2, dim=2)
        return [row.numpy() for row in q]

    def documents(self, texts: list[str]) -> list[np.ndarray]:
        torch, tok = self.torch, self.tok
        enc = tok([". " + t for t in texts], padding="longest", truncation="longest_first", return_tensors="pt",
                  max_length=self.meta["doc_maxlen"])
        ids, mask = enc["input_ids"], enc["attention_mask"]
        ids[:, 1] = tok.convert_tokens_to_ids(self.meta["doc_token_id"])
        d = torch.nn.functional.normalize(self._forward(ids, mask), p=2, dim=2)
        keep = [[int(x) not in self.skiplist and int(x) != tok.pad_token_id for x in row] for row in ids]
        return [row[torch.tensor(k)].numpy() for row, k in zip(d, keep)]


@pytest.fixture(scope="session")
def colbert_dirs(minilm_dir):
    built: dict[tuple[str, str], Path] = {}

    def get(variant: str, backend: str = "torch") -> Path:
        if (variant, backend) in built:
            return built[variant, backend]
        if importlib.util.find_spec(BACKENDS[backend]) is None:
            pytest.skip(f"the {backend} extra is not installed here")
        src = cached_build(f"stanford-colbert-{variant}", SOURCES,
                           partial(family_models.build_stanford_colbert, minilm_dir, variant=variant))
        if backend == "onnx":
            from core.convert import onnx_export

            src = cached_build(f"stanford-colbert-{variant}-onnx", [*SOURCES, *ONNX_EXPORT_SOURCES],
                               lambda out: onnx_export.export_folder(src, out))
        elif backend == "ct2":
            from core.convert import ct2

            src = cached_build(f"stanford-colbert-{variant}-ct2", [*SOURCES, *CT2_SOURCES],
                               lambda out: ct2.convert_folder(src, out))
        built[variant, backend] = src
        return src

    return get


@pytest.fixture(scope="session")
def references(colbert_dirs):
    cache = {}

    def get(variant: str) -> ColBERTReference:
        if variant not in cache:
            cache[variant] = ColBERTReference(colbert_dirs(variant))
        return cache[variant]

    return get


@pytest.mark.parametrize("variant", VARIANTS)
def test_detected_with_the_checkpoints_settings(colbert_dirs, variant):
    folder = colbert_dirs(variant)
    assert "HF_ColBERT" in json.loads((folder / "config.json").read_text())["architectures"]
    assert not (folder / "modules.json").exists()
    assert detect_task(read_model_info(folder)) == "late_interaction"
    meta, _ = family_models.STANFORD_COLBERTS[variant]
    card = Engine.load(ModelSpec(path=folder, backend="torch"), Settings(threads=2), warm_up=False).describe()
    assert (card["dimension"], card["query_length"], card["document_length"]) == (
        meta["dim"], meta["query_maxlen"], meta["doc_maxlen"])


def _cells():
    for variant in VARIANTS:
        for backend in BACKENDS:
            attends = family_models.STANFORD_COLBERTS[variant][0]["attend_to_mask_tokens"]
            if backend == "ct2" and not attends:  # refused: test_ct2_refuses_unattended_query_expansion
                continue
            yield pytest.param(variant, backend, id=f"{variant}-{backend}")


@pytest.mark.parametrize("variant, backend", list(_cells()))
def test_vectors_and_scores_match_colberts_recipe(colbert_dirs, references, variant, backend):
    engine = Engine.load(ModelSpec(path=colbert_dirs(variant, backend), backend=backend), Settings(threads=2))
    assert engine.backend.name == backend
    ref = references(variant)
    worst = 1.0
    got_q = engine.run_sync(EmbedRequest(texts=[QUERY, SENTENCES[3]], input_type="query")).vectors
    for got, want in zip(got_q, ref.queries([QUERY, SENTENCES[3]])):
        assert got.shape == want.shape  # expanded to query_maxlen
        worst = min(worst, float((got * want).sum(1).min()))
        np.testing.assert_allclose(got, want, atol=1e-5)
    got_d = engine.run_sync(EmbedRequest(texts=TEXTS, input_type="document")).vectors
    want_d = ref.documents(TEXTS)
    for got, want in zip(got_d, want_d):
        assert got.shape == want.shape  # cut at doc_maxlen, punctuation skipped
        worst = min(worst, float((got * want).sum(1).min()))
        np.testing.assert_allclose(got, want, atol=1e-5)
    doc_maxlen = family_models.STANFORD_COLBERTS[variant][0]["doc_maxlen"]
    assert len(ref.tok(". " + LONG)["input_ids"]) > doc_maxlen >= len(got_d[-1])  # LONG is cut
    scores = engine.run_sync(MaxSimRequest(QUERY, [d for d in DOCS if d])).scores
    q = ref.queries([QUERY])[0]
    want_scores = [float((q @ d.T).max(axis=1).sum()) for d in ref.documents([d for d in DOCS if d])]
    print(f"\n[parity] stanford-colbert {variant} {backend}: worst token cosine {worst:.7f}, "
          f"max score diff {np.abs(np.asarray(scores) - want_scores).max():.2e}")
    np.testing.assert_allclose(scores, want_scores, atol=1e-4)


def test_converted_folders_carry_the_projection(colbert_dirs):
    folder = colbert_dirs("attend-masks", "onnx")
    assert (folder / "linear.safetensors").exists() and not (folder / "model.safetensors").exists()


def test_ct2_refuses_unattended_query_expansion(colbert_dirs, colbert_dir):
    """CTranslate2 runs attended positions only: ColBERT's unattended [MASK] expansions (colbertv2.0, PyLate's
    default) would come out different, so the load is refused naming the backends that compute them."""
    from core.errors import Unsupported

    for folder in (colbert_dirs("colbertv2", "ct2"), colbert_dir):
        with pytest.raises(Unsupported, match="not attended.*CTranslate2.*'torch' or 'onnx'"):
            Engine.load(ModelSpec(path=folder, backend="ct2"), Settings(threads=2))
