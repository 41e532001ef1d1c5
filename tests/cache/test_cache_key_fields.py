"""The embedding cache's key against every field that could change a vector: each field of ``EmbedRequest``,
of the wire schemas that build one and of ``ModelSpec`` has a decision in core/cache (enumerated from the
classes themselves, so a field added later without a decision fails here), and every field in the key gives
two entries for two values, through the real app with the memory cache."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest
from fastapi.testclient import TestClient

from core.api.app import create_app
from core.cache.identity import IN_IDENTITY, SPEC_FIELDS
from core.config import BACKEND_OPTIONS, ChunkingDefault, Settings
from tests.cache.test_embedding_cache import metric, vectors_of
from tests.parity.test_custom_code_parity import jina_dir  # noqa: F401 (the tiny jina-v3-style model)

LONG = ("the options test sentence, long enough to need a few windows of eight tokens each, and long enough "
        "again to lose its start or its end when it is cut at thirty two tokens of the model's window")


# --- every field has a decision -------------------------------------------------------------------------


def _embed_request_fields() -> list[str]:
    from core.tasks.embed import EmbedRequest

    return [f.name for f in dataclasses.fields(EmbedRequest)]


def _wire_schemas() -> dict[str, type]:
    """Every request model the embeddings routes take (core/api/embeddings/schemas.py), nested ones too."""
    from core.api.common import StrictRequest
    from core.api.embeddings import schemas

    return {name: cls for name, cls in vars(schemas).items()
            if inspect.isclass(cls) and issubclass(cls, StrictRequest) and cls.__module__ == schemas.__name__}


def _wire_fields() -> list[tuple[str, str]]:
    return [(name, field) for name, cls in _wire_schemas().items() for field in cls.model_fields]


def _spec_fields() -> list[str]:
    from core.config import ModelSpec

    return list(ModelSpec.model_fields)


def _backend_option_fields() -> list[str]:
    from core.config import BACKEND_OPTIONS

    return [f"{backend}.{field}" for backend, model in BACKEND_OPTIONS.items() for field in model.model_fields]


@pytest.mark.parametrize("field", _embed_request_fields())
def test_every_embed_request_field_has_a_cache_decision(field):
    from core import cache

    decisions = {cache.KEY, cache.TEXT, cache.DEFAULT_ONLY, cache.AFTER, cache.NO_VECTOR}
    assert field in cache.REQUEST_FIELDS, f"EmbedRequest.{field} has no cache decision (core/cache REQUEST_FIELDS)"
    assert cache.REQUEST_FIELDS[field] in decisions


def test_no_cache_decision_names_a_field_that_is_gone():
    from core import cache

    assert set(cache.REQUEST_FIELDS) == set(_embed_request_fields())


def test_every_wire_schema_has_its_decisions():
    from core import cache

    assert set(cache.WIRE_FIELDS) == set(_wire_schemas())


@pytest.mark.parametrize("schema,field", _wire_fields())
def test_every_wire_field_has_a_cache_decision(schema, field):
    """A wire field becomes EmbedRequest field(s) (their decision applies) or has a decision of its own."""
    from core import cache

    decision = cache.WIRE_FIELDS.get(schema, {}).get(field)
    assert decision is not None, f"{schema}.{field} has no cache decision (core/cache WIRE_FIELDS)"
    targets = decision if isinstance(decision, tuple) else (decision,)
    own = {cache.MODEL, cache.AFTER, cache.NO_VECTOR, cache.REFUSED}
    assert all(t in cache.REQUEST_FIELDS or t in own for t in targets), decision
    assert set(cache.WIRE_FIELDS[schema]) == set(_wire_schemas()[schema].model_fields)


@pytest.mark.parametrize("field", _spec_fields())
def test_every_model_spec_field_has_an_identity_decision(field):
    from core.cache import identity

    assert identity.SPEC_FIELDS.get(field) in {identity.IN_IDENTITY, identity.FILES, identity.NO_VECTOR,
                                               identity.AFTER}, f"ModelSpec.{field}: no decision (SPEC_FIELDS)"


@pytest.mark.parametrize("option", _backend_option_fields())
def test_every_backend_option_has_an_identity_decision(option):
    from core.cache import identity

    assert identity.BACKEND_OPTION_FIELDS.get(option) in {identity.IN_IDENTITY, identity.NO_VECTOR}, option


def test_no_identity_decision_names_a_field_that_is_gone():
    from core.cache import identity

    assert set(identity.SPEC_FIELDS) == set(_spec_fields())
    assert set(identity.BACKEND_OPTION_FIELDS) == set(_backend_option_fields())


def test_a_field_without_a_decision_makes_nothing_cacheable(monkeypatch):
    """Fail safe: an EmbedRequest field the cache has not decided on turns the cache off for every request."""
    from core import cache

    monkeypatch.setattr(cache, "REQUEST_FIELDS", {k: v for k, v in cache.REQUEST_FIELDS.items() if k != "task"})
    cache._request_defaults.cache_clear()
    try:
        assert cache._request_defaults() is None
    finally:
        monkeypatch.undo()
        cache._request_defaults.cache_clear()
    assert cache._request_defaults() is not None


# --- the model identity -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def onnx_engine(minilm_onnx_dir):
    from core.config import ModelSpec
    from core.engine import Engine

    return Engine.load(ModelSpec(path=minilm_onnx_dir, backend="onnx"), Settings(threads=1), warm_up=False)


#: a second value of each spec field the identity holds as it is written (the folder's own value is the first)
SPEC_VALUES = {
    "device": {"device": "cuda"},
    "dtype": {"dtype": "float16"},
    "prompts": {"prompts": {"query": "query: "}},
    "default_prompt_name": {"default_prompt_name": "query"},
    "pooling": {"pooling": "cls"},
    "dense_path": {"dense_path": "2_Dense"},
    "chunking": {"chunking": ChunkingDefault(size=16, overlap=2)},
}
#: spec fields the identity holds as the engine serves them: the part of the identity it is
SERVED_AS = {
    "task": lambda engine: engine.task.name,
    "backend": lambda engine: engine.backend.name,
    "max_length": lambda engine: engine.task.info.max_length,
}


def _with(engine, **update):
    """The engine's real task and backend with a spec that differs in ``update``: what the identity reads."""
    import types

    return types.SimpleNamespace(spec=engine.spec.model_copy(update=update), task=engine.task, backend=engine.backend)


@pytest.mark.parametrize("field", [f for f, d in SPEC_FIELDS.items() if d == IN_IDENTITY and f not in BACKEND_OPTIONS])
def test_each_spec_field_in_the_identity_is_held(onnx_engine, field):
    """(Each backend's options: test_the_served_backends_options_change_the_identity.)"""
    from core.cache.identity import identity_parts, model_identity

    assert field in SPEC_VALUES or field in SERVED_AS, f"ModelSpec.{field} is in the identity: test its part here"
    if field in SPEC_VALUES:
        assert model_identity(_with(onnx_engine, **SPEC_VALUES[field])) != model_identity(onnx_engine)
    else:
        assert identity_parts(onnx_engine)[field] == SERVED_AS[field](onnx_engine)


def test_the_served_backends_options_change_the_identity(onnx_engine):
    from core.cache.identity import backend_options, model_identity

    assert all(SPEC_FIELDS[backend] == IN_IDENTITY for backend in BACKEND_OPTIONS)
    onnx = onnx_engine.spec.onnx
    for update in ({"providers": ["CPUExecutionProvider"]}, {"optimized": not onnx.optimized}):
        assert model_identity(_with(onnx_engine, onnx=onnx.model_copy(update=update))) != model_identity(onnx_engine)
    torch = onnx_engine.spec.torch
    assert backend_options(onnx_engine.spec.model_copy(update={"torch": torch.model_copy(update={"compile": True})}),
                           "torch") != backend_options(onnx_engine.spec, "torch")


def test_options_that_change_no_vector_keep_the_identity(onnx_engine):
    from core.cache.identity import model_identity

    spec = onnx_engine.spec
    same = _with(onnx_engine, name="another", max_batch_size=3, threads=1, embedding_dtype="int8",
                 onnx=spec.onnx.model_copy(update={"workers": 2, "spin": False}),
                 torch=spec.torch.model_copy(update={"compile": True}))
    assert model_identity(same) == model_identity(onnx_engine)


def test_a_max_length_override_changes_the_identity(minilm_onnx_dir, onnx_engine):
    from core.cache.identity import model_identity
    from core.config import ModelSpec
    from core.engine import Engine

    shorter = Engine.load(ModelSpec(path=minilm_onnx_dir, backend="onnx", max_length=64), Settings(threads=1),
                          warm_up=False)
    assert shorter.task.info.max_length == 64 != onnx_engine.task.info.max_length
    assert model_identity(shorter) != model_identity(onnx_engine)


def test_the_identity_holds_the_key_version(onnx_engine, monkeypatch):
    from core.cache import identity

    before = identity.model_identity(onnx_engine)
    monkeypatch.setattr(identity, "KEY_VERSION", identity.KEY_VERSION + 1)
    assert identity.model_identity(onnx_engine) != before


# --- every field in the key gives its own entries -----------------------------------------------------------


def _app(models, cache: str):
    return TestClient(create_app(Settings(models=models, threads=2, embedding_cache=cache)))


@pytest.fixture(scope="module")
def minilm_models(minilm_onnx_dir):
    return [{"path": str(minilm_onnx_dir), "name": "minilm", "backend": "onnx",
             "prompts": {"query": "query: ", "passage": "passage: "}}]


@pytest.fixture(scope="module")
def minilm_apps(minilm_models):
    with _app(minilm_models, "memory") as cached, _app(minilm_models, "off") as uncached:
        yield cached, uncached


@pytest.fixture(scope="module")
def jina_apps(jina_dir):  # noqa: F811
    models = [{"path": str(jina_dir), "name": "jina", "backend": "torch", "trust_remote_code": True}]
    with _app(models, "memory") as cached, _app(models, "off") as uncached:
        yield cached, uncached


@dataclasses.dataclass(frozen=True)
class Case:
    """Two requests that differ in one key field: ``route``'s bodies ``a`` and ``b``; ``differ``: their
    vectors differ (else the field keeps them apart without changing the vector here)."""

    a: dict
    b: dict
    differ: bool = True
    route: str = "/v1/embeddings"
    apps: str = "minilm_apps"
    #: copies of the text sent (enough to be over the model's max length: which end is cut shows)
    copies: int = 1


#: every KEY field of core/cache REQUEST_FIELDS → the cases that show it keeps two values apart
KEY_CASES: dict[str, list[Case]] = {
    "truncate": [Case({"truncate": True}, {"truncate": False}, differ=False)],
    "normalize": [Case({"normalize": True}, {"normalize": False})],
    "dimensions": [Case({"dimensions": 32}, {"dimensions": 64})],
    "prompt": [Case({"prompt": "query: "}, {"prompt": "passage: "})],
    "prompt_name": [Case({"prompt_name": "query"}, {"prompt_name": "passage"})],
    "input_type": [Case({"input_type": "query"}, {"input_type": "document"}, differ=False)],
    "truncation_direction": [Case({"truncation_direction": "Right", "normalize": True},
                                  {"truncation_direction": "Left", "normalize": True}, route="/embed", copies=12)],
    "chunking": [Case({"chunking": {"size": 8, "overlap": 2}}, {"chunking": {"size": 8, "overlap": 0}}),
                 Case({"chunking": {"size": 8}}, {"chunking": {"size": 16}})],
    "task": [Case({"task": "retrieval.query"}, {"task": "retrieval.passage"}, apps="jina_apps")],
}


def test_every_key_field_has_a_behavioural_case():
    from core.cache import VECTOR_OPTIONS

    assert set(KEY_CASES) == set(VECTOR_OPTIONS)


def _vectors(response, route: str) -> np.ndarray:
    if route == "/embed":
        assert response.status_code == 200, response.text
        return np.asarray(response.json(), dtype=np.float32)
    return vectors_of(response)


def _ask(client, route: str, text: str, body: dict):
    if route == "/embed":
        return client.post(route, json={"inputs": [text], **body})
    return client.post(route, json={"input": [text], "encoding_format": "base64", **body})


def _misses(client) -> float:
    return metric(client.get("/metrics").text, "tessera_embedding_cache_misses_total")


@pytest.mark.parametrize("field,case", [(f, c) for f, cases in KEY_CASES.items() for c in cases],
                         ids=[f"{f}-{i}" for f, cases in KEY_CASES.items() for i in range(len(cases))])
def test_two_values_of_a_key_field_are_two_entries(request, field, case):
    cached, uncached = request.getfixturevalue(case.apps)
    text = " ".join([LONG] * case.copies) + f" ({field} {case.a} {case.b})"
    before = _misses(cached)
    a = _vectors(_ask(cached, case.route, text, case.a), case.route)
    b = _vectors(_ask(cached, case.route, text, case.b), case.route)
    assert _misses(cached) - before == 2, f"{field}: the second value was answered from the first's entry"
    assert b.tobytes() == _vectors(_ask(uncached, case.route, text, case.b), case.route).tobytes()
    assert a.tobytes() == _vectors(_ask(uncached, case.route, text, case.a), case.route).tobytes()
    if case.differ:
        assert a.shape != b.shape or not np.allclose(a, b, atol=1e-4), f"{field}: the two values give one vector"
    again = _vectors(_ask(cached, case.route, text, case.b), case.route)
    assert again.tobytes() == b.tobytes() and _misses(cached) - before == 2
