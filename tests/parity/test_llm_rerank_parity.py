"""LLM rerankers (Qwen3-Reranker layout): a tiny random Qwen3ForCausalLM scored by its "yes"/"no" next-token
logits after the reranker prompt. The reference is the model card's computation written directly with
transformers (AutoTokenizer padding left, AutoModelForCausalLM, logits[:, -1, [no, yes]] → softmax), on the
original folder layout and on the sentence-transformers one (also checked against its CrossEncoder), served on
torch and on the ONNX graph our exporter writes; batched == single; long documents lose their tail, never the
template's end; every rerank route serves it, with a per-request instruction."""

from __future__ import annotations

import asyncio
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import TesseraError, TooLarge, Unsupported
from core.loading import detect_task, read_model_info
from core.tasks.rerank import RerankRequest
from tests.support import llm_rerank_models, text_models
from tests.support.cache import ONNX_EXPORT_SOURCES, cached_build
from tests.support.sentences import DOCS, QUERY

SETTINGS = Settings(threads=2)
# the builders, and the tokenizer helpers they share with the decoder embedders
SOURCES = [Path(llm_rerank_models.__file__), Path(text_models.__file__)]
TASK_SOURCE = Path(llm_rerank_models.__file__).parents[2] / "core" / "tasks" / "llm_rerank.py"
TOL = 1e-5  # fp32

# the model card's template, written out here (not imported), so the reference is independent of the task
CARD_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
               "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
CARD_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
CARD_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

LONG_DOC = " ".join(["Berlin is a large city with many parks, rivers and lakes."] * 60)


@pytest.fixture(scope="session")
def llm_reranker_dirs():
    built: dict[tuple[str, str], Path] = {}

    def get(layout: str = "original", backend: str = "torch") -> Path:
        if (layout, backend) not in built:
            folder = cached_build("tiny-qwen3-reranker", [*SOURCES, TASK_SOURCE], llm_rerank_models.build_causal_lm)
            if layout == "st":
                folder = cached_build("tiny-qwen3-reranker-st", [*SOURCES, TASK_SOURCE],
                                      partial(llm_rerank_models.build_st_layout, folder))
            if backend == "onnx":
                pytest.importorskip("onnxruntime")
                from core.convert import onnx_export

                src = folder
                folder = cached_build(f"tiny-qwen3-reranker-{layout}-onnx",
                                      [*SOURCES, TASK_SOURCE, *ONNX_EXPORT_SOURCES],
                                      lambda out: onnx_export.export_folder(src, out))
            built[layout, backend] = folder
        return built[layout, backend]

    return get


def reference(folder: Path, query: str, docs: list[str], *, instruction: str | None = None,
              max_length: int = 8192, raw: bool = False) -> np.ndarray:
    """Qwen3-Reranker's model-card usage (transformers), verbatim in substance."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder), padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    no_id, yes_id = tokenizer.convert_tokens_to_ids("no"), tokenizer.convert_tokens_to_ids("yes")
    prefix = tokenizer.encode(CARD_PREFIX, add_special_tokens=False)
    suffix = tokenizer.encode(CARD_SUFFIX, add_special_tokens=False)
    instruction = CARD_INSTRUCTION if instruction is None else instruction
    pairs = [f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {d}" for d in docs]
    inputs = tokenizer(pairs, padding=False, truncation="longest_first", return_attention_mask=False,
                       max_length=max_length - len(prefix) - len(suffix))
    inputs["input_ids"] = [prefix + ids + suffix for ids in inputs["input_ids"]]
    inputs = tokenizer.pad(inputs, padding=True, return_tensors="pt", max_length=max_length)
    with torch.no_grad():
        last = model(**inputs).logits[:, -1, :]
    pair = torch.stack([last[:, no_id], last[:, yes_id]], dim=1)
    if raw:
        return (pair[:, 1] - pair[:, 0]).numpy()
    return torch.nn.functional.log_softmax(pair, dim=1)[:, 1].exp().numpy()


def _engine(folder: Path, backend: str = "torch", **spec) -> Engine:
    return Engine.load(ModelSpec(path=folder, backend=backend, **spec), SETTINGS)


WORST: dict[str, float] = {}


@pytest.mark.parametrize("instruction", [None, "Judge whether the passage states a population figure"])
@pytest.mark.parametrize("backend", ["torch", "onnx"])
@pytest.mark.parametrize("layout", ["original", "st"])
def test_parity_with_transformers(llm_reranker_dirs, layout, backend, instruction):
    engine = _engine(llm_reranker_dirs(layout, backend), backend)
    assert engine.task.head == "causal-lm" and engine.task.describe()["layout"] == "causal-lm"
    ref = reference(llm_reranker_dirs(), QUERY, DOCS, instruction=instruction)
    got = engine.run_sync(RerankRequest(QUERY, DOCS, instruction=instruction)).scores
    diff = float(np.abs(got - ref).max())
    WORST[backend] = max(WORST.get(backend, 0.0), diff)
    print(f"\n[parity] llm-rerank {layout} {backend} instruction={instruction is not None}: max abs diff {diff:.2e}")
    assert diff <= TOL
    assert np.ptp(ref) > 100 * TOL  # the documents' scores differ far more than the error
    raw = engine.run_sync(RerankRequest(QUERY, DOCS, instruction=instruction, raw_scores=True)).scores
    np.testing.assert_allclose(raw, reference(llm_reranker_dirs(), QUERY, DOCS, instruction=instruction, raw=True),
                               atol=1e-4, rtol=0)


def test_instruction_changes_the_scores(llm_reranker_dirs):
    engine = _engine(llm_reranker_dirs())
    default = engine.run_sync(RerankRequest(QUERY, DOCS)).scores
    other = engine.run_sync(RerankRequest(QUERY, DOCS, instruction="Find passages about cats")).scores
    assert np.abs(default - other).max() > 100 * TOL


def test_spec_default_prompt_is_the_instruction(llm_reranker_dirs):
    """Per model: the spec's ``prompts`` + ``default_prompt_name`` (sentence-transformers' way of setting a
    CrossEncoder's instruction) replace the default instruction; a request's own still wins."""
    mine = "Judge whether the passage states a population figure"
    engine = _engine(llm_reranker_dirs(), prompts={"pop": mine}, default_prompt_name="pop")
    np.testing.assert_allclose(engine.run_sync(RerankRequest(QUERY, DOCS)).scores,
                               reference(llm_reranker_dirs(), QUERY, DOCS, instruction=mine), atol=TOL, rtol=0)
    np.testing.assert_allclose(engine.run_sync(RerankRequest(QUERY, DOCS, instruction=CARD_INSTRUCTION)).scores,
                               reference(llm_reranker_dirs(), QUERY, DOCS), atol=TOL, rtol=0)


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_st_layout_matches_sentence_transformers(llm_reranker_dirs, backend):
    """The sentence-transformers layout (Transformer → LogitScore, the reranker chat template, the instruction
    as its default prompt): our raw scores are CrossEncoder.predict's log-odds, our scores its sigmoid."""
    import torch
    from sentence_transformers import CrossEncoder

    folder = llm_reranker_dirs("st")
    ce = CrossEncoder(str(folder), device="cpu")
    pairs = [(QUERY, d) for d in DOCS]
    engine = _engine(llm_reranker_dirs("st", backend), backend)
    np.testing.assert_allclose(engine.run_sync(RerankRequest(QUERY, DOCS, raw_scores=True)).scores,
                               ce.predict(pairs, activation_fn=torch.nn.Identity()), atol=1e-4, rtol=0)
    np.testing.assert_allclose(engine.run_sync(RerankRequest(QUERY, DOCS)).scores,
                               ce.predict(pairs, activation_fn=torch.nn.Sigmoid()), atol=TOL, rtol=0)


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_batched_through_batcher_equals_single(llm_reranker_dirs, backend):
    engine = _engine(llm_reranker_dirs("original", backend), backend)
    docs = DOCS + [LONG_DOC[:300], LONG_DOC[:40]]
    singles = np.array([engine.run_sync(RerankRequest(QUERY, [d])).scores[0] for d in docs])

    async def main():
        await engine.start()
        try:
            together = await engine(RerankRequest(QUERY, docs))
            apart = await asyncio.gather(*(engine(RerankRequest(QUERY, [d])) for d in docs))
        finally:
            await engine.stop()
        return together.scores, np.array([r.scores[0] for r in apart])

    together, apart = asyncio.run(main())
    np.testing.assert_allclose(together, singles, atol=TOL, rtol=0)
    np.testing.assert_allclose(apart, singles, atol=TOL, rtol=0)


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_long_document_keeps_the_template_end(llm_reranker_dirs, backend):
    engine = _engine(llm_reranker_dirs("original", backend), backend, max_length=240)
    task = engine.task
    items = task.prepare(RerankRequest(QUERY, [LONG_DOC, DOCS[0]]))
    assert items[0].cost == 240 and items[1].cost < 240
    suffix = task.suffix.tolist()
    for item in items:  # prompt start and the end where the model answers, whatever was cut
        assert item.ids[: task.prefix.size].tolist() == task.prefix.tolist()
        assert item.ids[-len(suffix):].tolist() == suffix
    ref = reference(llm_reranker_dirs(), QUERY, [LONG_DOC, DOCS[0]], max_length=240)
    np.testing.assert_allclose(engine.run_sync(RerankRequest(QUERY, [LONG_DOC, DOCS[0]])).scores, ref,
                               atol=TOL, rtol=0)
    with pytest.raises(TooLarge):
        engine.run_sync(RerankRequest(QUERY, [LONG_DOC], truncate=False))


def test_a_long_query_is_cut_once_with_the_same_scores(llm_reranker_dirs):
    """A query over the window is cut before pairing (tokenized once, not once per document); each pair keeps
    the same tokens as when the whole query is written into it."""
    engine = _engine(llm_reranker_dirs(), max_length=240)
    query = "How many people live in Berlin and its suburbs? " * 200
    assert engine.task._bounded_query(CARD_INSTRUCTION, RerankRequest(query, DOCS[:2])) != query
    items = engine.task.prepare(RerankRequest(query, DOCS[:2]))
    assert [it.cost for it in items] == [240, 240]
    np.testing.assert_allclose(engine.run_sync(RerankRequest(query, DOCS[:2])).scores,
                               reference(llm_reranker_dirs(), query, DOCS[:2], max_length=240), atol=TOL, rtol=0)
    with pytest.raises(TooLarge):
        engine.run_sync(RerankRequest(query, DOCS[:2], truncate=False))


def test_max_tokens_per_doc_clips_the_document(llm_reranker_dirs):
    from tokenizers import Tokenizer

    folder = llm_reranker_dirs()
    engine = _engine(folder)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    enc = tok.encode(LONG_DOC, add_special_tokens=False)
    clipped = LONG_DOC[: enc.offsets[9][1]]
    np.testing.assert_allclose(engine.run_sync(RerankRequest(QUERY, [LONG_DOC], max_tokens_per_doc=10)).scores,
                               reference(folder, QUERY, [clipped]), atol=TOL, rtol=0)


def test_detection(llm_reranker_dirs, tmp_path):
    assert detect_task(read_model_info(llm_reranker_dirs())) == "llm_rerank"  # named as a reranker
    assert detect_task(read_model_info(llm_reranker_dirs("st"))) == "llm_rerank"  # LogitScore module
    assert detect_task(read_model_info(llm_reranker_dirs("original", "onnx"))) == "llm_rerank"
    # in a Hugging Face cache the snapshot folder is a revision; the repository folder names the model
    snapshot = tmp_path / "hub" / "models--org--Tiny-Reranker" / "snapshots" / "0123abcd"
    shutil.copytree(llm_reranker_dirs(), snapshot)
    assert detect_task(read_model_info(snapshot)) == "llm_rerank"
    # a causal LM whose name says nothing: not guessed; spec ``task: rerank`` makes it an LLM reranker
    plain = tmp_path / "tiny-causal-lm"
    shutil.copytree(llm_reranker_dirs(), plain)
    assert detect_task(read_model_info(plain)) != "llm_rerank"
    engine = _engine(plain, task="rerank")
    assert engine.task.head == "causal-lm"
    np.testing.assert_allclose(engine.run_sync(RerankRequest(QUERY, DOCS)).scores,
                               reference(llm_reranker_dirs(), QUERY, DOCS), atol=TOL, rtol=0)


def test_other_chat_template_is_refused(llm_reranker_dirs, tmp_path):
    folder = tmp_path / "other-template"
    shutil.copytree(llm_reranker_dirs("st"), folder)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n")
    with pytest.raises(Unsupported, match="chat template"):
        _engine(folder)


def test_cross_encoder_refuses_an_instruction(reranker_dir):
    from core.errors import InvalidInput

    with pytest.raises(InvalidInput, match="instruction"):
        _engine(reranker_dir).run_sync(RerankRequest(QUERY, DOCS, instruction="x"))


def test_onnx_graph_outputs_next_token_logits(llm_reranker_dirs):
    import onnx

    graph = onnx.load(str(llm_reranker_dirs("original", "onnx") / "onnx" / "model.onnx"),
                      load_external_data=False).graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in graph.output] == ["next_token_logits"]


def test_ct2_refuses(llm_reranker_dirs):
    pytest.importorskip("ctranslate2")
    with pytest.raises(TesseraError, match="causal-lm"):
        _engine(llm_reranker_dirs(), "ct2")


def test_every_rerank_route(llm_reranker_dirs):
    """/v1/rerank (Infinity / Cohere v1), /v2/rerank (Cohere v2) and TEI's /rerank go through the same task."""
    from fastapi.testclient import TestClient

    from core.api.app import create_app

    folder = llm_reranker_dirs()
    mine = "Judge whether the passage states a population figure"
    ref, ref_mine = reference(folder, QUERY, DOCS), reference(folder, QUERY, DOCS, instruction=mine)
    order = np.argsort(-ref, kind="stable").tolist()
    settings = Settings(models=[ModelSpec(path=folder, name="qwen-rr")], threads=2)
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/rerank", json={"model": "qwen-rr", "query": QUERY, "documents": DOCS})
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["index"] for x in results] == order
        np.testing.assert_allclose([x["relevance_score"] for x in results], ref[order], atol=TOL)
        r = client.post("/v2/rerank", json={"model": "qwen-rr", "query": QUERY, "documents": DOCS,
                                            "instruction": mine, "top_n": 2})
        assert r.status_code == 200, r.text
        best = np.argsort(-ref_mine, kind="stable")[:2].tolist()
        assert [x["index"] for x in r.json()["results"]] == best
        np.testing.assert_allclose([x["relevance_score"] for x in r.json()["results"]], ref_mine[best], atol=TOL)
        r = client.post("/rerank", json={"model": "qwen-rr", "query": QUERY, "texts": DOCS})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(sorted(x["score"] for x in r.json()), np.sort(ref), atol=TOL)
        r = client.post("/v1/rerank", json={"model": "qwen-rr", "query": QUERY, "documents": [LONG_DOC * 4],
                                            "truncate": False})
        assert r.status_code == 413 and set(r.json()["error"]) == {"message", "type", "param", "code"}
        info = client.get("/v1/models").json()
        entry = next(m for m in info["data"] if m["id"] == "qwen-rr")
        assert entry["task"] == "rerank" and entry["layout"] == "causal-lm" and entry["instruction"] == CARD_INSTRUCTION
        # TEI's /info: the score's one label is the "yes" token (not the causal LM config's placeholder labels)
        assert client.get("/info", params={"model": "qwen-rr"}).json()["model_type"] == {
            "reranker": {"id2label": {"0": "yes"}, "label2id": {"yes": 0}}}
