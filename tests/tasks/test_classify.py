"""Classification: parity with transformers' text-classification pipeline on the same (tiny) weights."""

from __future__ import annotations

import numpy as np

from core.loading import detect_task, read_model_info
from core.tasks.classify import ClassifyRequest
from tests.support.engines import load_engine
from tests.support.text_models import LABELS

TEXTS = ["I love this product!", "This is terrible.", "It arrived on Tuesday.", "ok"]


def pipeline_scores(folder, texts, function_to_apply=None):
    from transformers import pipeline

    kwargs = {"function_to_apply": function_to_apply} if function_to_apply else {}
    pipe = pipeline("text-classification", model=str(folder), device="cpu", top_k=None)
    out = pipe(texts, **kwargs)
    order = [LABELS[i] for i in range(len(LABELS))]
    return np.array([[next(d["score"] for d in row if d["label"] == lab) for lab in order] for row in out])


def test_detects_classify(classifier_dir, multilabel_dir):
    assert detect_task(read_model_info(classifier_dir)) == "classify"
    assert detect_task(read_model_info(multilabel_dir)) == "classify"


def test_softmax_matches_pipeline(classifier_dir):
    engine = load_engine(classifier_dir)
    result = engine.run_sync(ClassifyRequest(texts=TEXTS))
    assert result.labels == ["negative", "neutral", "positive"]
    np.testing.assert_allclose(result.scores, pipeline_scores(classifier_dir, TEXTS), atol=1e-5, rtol=0)
    np.testing.assert_allclose(result.scores.sum(axis=1), 1.0, atol=1e-5)
    assert np.ptp(result.scores) > 1e-2


def test_raw_scores_are_logits(classifier_dir):
    engine = load_engine(classifier_dir)
    raw = engine.run_sync(ClassifyRequest(texts=TEXTS, raw_scores=True)).scores
    np.testing.assert_allclose(raw, pipeline_scores(classifier_dir, TEXTS, "none"), atol=1e-5, rtol=0)


def test_multilabel_uses_sigmoid(multilabel_dir):
    engine = load_engine(multilabel_dir)
    result = engine.run_sync(ClassifyRequest(texts=TEXTS))
    assert engine.task.multi_label
    np.testing.assert_allclose(result.scores, pipeline_scores(multilabel_dir, TEXTS), atol=1e-5, rtol=0)
    assert not np.allclose(result.scores.sum(axis=1), 1.0)


def test_text_pairs_match_model_outputs(classifier_dir):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    pairs = [("A man is eating.", "Someone eats food."), ("A man is eating.", "The sky is blue.")]
    ours = load_engine(classifier_dir).run_sync(ClassifyRequest(pairs=pairs, raw_scores=True)).scores
    tok = AutoTokenizer.from_pretrained(str(classifier_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(classifier_dir)).eval()
    with torch.inference_mode():
        ref = model(**tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")).logits
    np.testing.assert_allclose(ours, ref.numpy(), atol=1e-5, rtol=0)
