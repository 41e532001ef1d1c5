"""Late interaction (ColBERT-style): token vectors and MaxSim vs a reference computed with transformers
and torch on the same weights (tiny PyLate-layout model), and a real-weights ranking check on MiniLM."""

from __future__ import annotations

import string

import numpy as np
import pytest

from core.errors import InvalidInput
from core.loading import detect_task, read_model_info
from core.tasks.embed import EmbedRequest
from core.tasks.late_interaction import MaxSimRequest
from tests.support.engines import load_engine
from tests.support.text_models import COLBERT_SETTINGS

QUERY = "who wrote the theory of relativity?"
DOCS = [
    "Albert Einstein published the theory of relativity, in 1905 and 1915!",
    "Bananas are rich in potassium; they grow in tropical climates.",
    "A very long document " + "with many, many words " * 40,
    "Longer than the model's max length: " + "relativity and gravitation " * 300,
]


class Reference:
    """PyLate's recipe written out with transformers/torch: prefix token after [CLS], queries padded with
    [MASK] to query_length (not attended), punctuation skipped in documents, projection, L2 norm."""

    def __init__(self, folder):
        import torch
        from safetensors.torch import load_file
        from transformers import AutoTokenizer, BertModel

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(str(folder))
        self.model = BertModel.from_pretrained(str(folder)).eval()
        self.weight = load_file(str(folder / "1_Dense" / "model.safetensors"))["linear.weight"]
        self.skip = {self.tok.convert_tokens_to_ids(w) for w in string.punctuation}

    def encode(self, text, is_query):
        torch = self.torch
        cfg = COLBERT_SETTINGS
        limit = cfg["query_length"] if is_query else cfg["document_length"]
        prefix = self.tok.convert_tokens_to_ids(cfg["query_prefix"] if is_query else cfg["document_prefix"])
        ids = self.tok(text, truncation=True, max_length=limit - 1)["input_ids"]
        ids = ids[:1] + [prefix] + ids[1:]
        attend = len(ids)
        if is_query:
            ids = ids + [self.tok.mask_token_id] * (limit - len(ids))
        mask = [1] * attend + [0] * (len(ids) - attend)
        with torch.inference_mode():
            hidden = self.model(input_ids=torch.tensor([ids]), attention_mask=torch.tensor([mask])).last_hidden_state[0]
        if not is_query:
            hidden = hidden[[t not in self.skip for t in ids]]
        return torch.nn.functional.normalize(hidden @ self.weight.T, dim=-1).numpy()

    def maxsim(self, q, d):
        return float((q @ d.T).max(axis=1).sum())


@pytest.fixture(scope="module")
def engine(colbert_dir):
    return load_engine(colbert_dir)


@pytest.fixture(scope="module")
def reference(colbert_dir):
    return Reference(colbert_dir)


def test_detects_late_interaction(colbert_dir):
    assert detect_task(read_model_info(colbert_dir)) == "late_interaction"


def test_document_vectors_match(engine, reference):
    result = engine.run_sync(EmbedRequest(texts=DOCS))
    assert len(result.vectors) == len(DOCS)
    for vecs, doc in zip(result.vectors, DOCS):
        ref = reference.encode(doc, is_query=False)
        assert vecs.shape == ref.shape and vecs.shape[1] == 16
        np.testing.assert_allclose(vecs, ref, atol=1e-5)
    assert result.vectors[2].shape[0] < 64  # document_length cut, punctuation removed
    assert result.vectors[3].shape[0] == 64 - 2  # cut to document_length; "'" and ':' skipped


def test_query_vectors_match(engine, reference):
    result = engine.run_sync(EmbedRequest(texts=[QUERY], input_type="query"))
    ref = reference.encode(QUERY, is_query=True)
    assert result.vectors[0].shape == (16, 16)  # expanded to query_length
    np.testing.assert_allclose(result.vectors[0], ref, atol=1e-5)


def test_maxsim_scores_match(engine, reference):
    scores = engine.run_sync(MaxSimRequest(QUERY, DOCS)).scores
    q = reference.encode(QUERY, True)
    ref = [reference.maxsim(q, reference.encode(d, False)) for d in DOCS]
    np.testing.assert_allclose(scores, ref, atol=1e-4)


def test_too_long_without_truncation(engine):
    from core.errors import TooLarge

    with pytest.raises(TooLarge):
        engine.run_sync(EmbedRequest(texts=[DOCS[3]], truncate=False))
    with pytest.raises(TooLarge):  # under the model's 512 but over document_length
        engine.run_sync(EmbedRequest(texts=[DOCS[2]], truncate=False))


def test_bad_input_type(engine):
    with pytest.raises(InvalidInput, match="input_type"):
        engine.run_sync(EmbedRequest(texts=["x"], input_type="banana"))
    with pytest.raises(InvalidInput, match="documents"):
        engine.run_sync(MaxSimRequest(QUERY, []))


def test_real_minilm_token_vectors_rank_relevant_passage_first(minilm_dir):
    """Late interaction on real weights: MaxSim over all-MiniLM-L6-v2 token vectors."""
    engine = load_engine(minilm_dir, task="late_interaction")
    docs = [
        "The cat sat on the mat and purred.",
        "Einstein developed the theory of relativity, one of the pillars of modern physics.",
        "Stock markets fell sharply on Monday after the interest rate announcement.",
    ]
    scores = engine.run_sync(MaxSimRequest(QUERY, docs)).scores
    assert int(np.argmax(scores)) == 1
    assert scores[1] > 1.2 * max(scores[0], scores[2]), scores


def test_onnx_backend_serves_late_interaction(minilm_dir, minilm_onnx_dir):
    """The task only needs the encoder head, so the ONNX export serves it too (same scores as torch)."""
    docs = ["Einstein developed the theory of relativity.", "The cat sat on the mat."]
    torch_scores = load_engine(minilm_dir, task="late_interaction").run_sync(MaxSimRequest(QUERY, docs)).scores
    onnx_engine = load_engine(minilm_onnx_dir, task="late_interaction", backend="onnx")
    assert onnx_engine.backend.name == "onnx"
    np.testing.assert_allclose(onnx_engine.run_sync(MaxSimRequest(QUERY, docs)).scores, torch_scores, atol=2e-3)


def test_dense_activation_and_unknown_modules(colbert_dir, tmp_path):
    """A PyLate Dense with an activation runs it (here Tanh, checked against the formula on the encoder's
    token vectors); a module type the task does not implement fails the load, naming it."""
    import json
    import shutil

    from core.errors import Unsupported

    folder = tmp_path / "tanh"
    shutil.copytree(colbert_dir, folder)
    cfg = json.loads((folder / "1_Dense" / "config.json").read_text())
    (folder / "1_Dense" / "config.json").write_text(json.dumps({**cfg, "activation_function":
                                                                "torch.nn.modules.activation.Tanh"}))
    plain = load_engine(colbert_dir).run_sync(EmbedRequest(texts=DOCS[:2]))
    tanh = load_engine(folder).run_sync(EmbedRequest(texts=DOCS[:2]))
    ref = Reference(colbert_dir)
    import torch

    for text, got, base in zip(DOCS[:2], tanh.vectors, plain.vectors):
        with torch.inference_mode():
            ids = ref.tok(text, truncation=True, max_length=COLBERT_SETTINGS["document_length"] - 1)["input_ids"]
            prefix = ref.tok.convert_tokens_to_ids(COLBERT_SETTINGS["document_prefix"])
            ids = ids[:1] + [prefix] + ids[1:]
            hidden = ref.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            hidden = hidden[[t not in ref.skip for t in ids]]
            want = torch.nn.functional.normalize(torch.tanh(hidden @ ref.weight.T), dim=-1).numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)
        assert np.abs(got - base).max() > 1e-3  # the activation changed the vectors

    modules = json.loads((folder / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "2_LayerNorm", "type": "sentence_transformers.models.LayerNorm"})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(Unsupported, match="LayerNorm"):
        load_engine(folder)
