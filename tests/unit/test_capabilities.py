"""One capability enum (core/capabilities.py), and the features that declare it (core/api/features.py): every
main capability a task can declare has a feature with its route and its warm requests."""

from __future__ import annotations

import orjson
import pytest
from fastapi import FastAPI

from core.api.features import FEATURES, feature_for, warm_bodies
from core.capabilities import AUXILIARY_CAPABILITIES, Capability
from core.tasks import TASKS, task_class


def test_capabilities_are_their_wire_names():
    assert Capability.EMBEDDINGS_SPARSE == "embeddings_sparse" and Capability("score") is Capability.SCORE
    values = sorted({Capability.TOKENIZE, Capability.RERANK})
    assert orjson.dumps(values) == b'["rerank","tokenize"]'
    assert f"{Capability.SCORE} {Capability.SCORE!r} {values}" == "score 'score' ['rerank', 'tokenize']"


def test_every_task_declares_capabilities_of_the_enum():
    for name in TASKS:
        declared = task_class(name).capabilities
        assert declared and all(isinstance(c, Capability) for c in declared), name


@pytest.mark.parametrize("capability", sorted(set(Capability) - AUXILIARY_CAPABILITIES))
def test_each_main_capability_has_a_feature_with_a_route_and_warm_requests(capability):
    feature = feature_for(capability)
    assert feature.route.startswith("/v1/")
    app = FastAPI()
    app.include_router(feature.router)
    assert "post" in app.openapi()["paths"][feature.route]  # the feature's own router serves its route
    sent = warm_bodies("m", {capability}, ("text",))
    assert sent and {route for route, _, _ in sent} == {feature.route}
    assert all(body["model"] == "m" for _, _, body in sent)


def test_auxiliary_capabilities_send_no_warm_request():
    assert warm_bodies("m", AUXILIARY_CAPABILITIES, ("text",)) == []
    with pytest.raises(KeyError):
        feature_for(Capability.EMBED_ALL)
    assert len({f.capability for f in FEATURES if f.capability is not None}) == len(
        [f for f in FEATURES if f.capability is not None])
