import json

import pytest

from tests.support.server import running_server

#: the prompts the OpenAI-SDK test sends by name (per-model settings, on top of the folder's own)
SPEC_PROMPTS = {"query": "Represent this sentence for searching relevant passages: "}


@pytest.fixture(scope="session")
def server(minilm_dir, reranker_dir, classifier_dir, splade_dir):
    """One real server on loopback with one model per text task (one per capability, as TEI's routes need)."""
    models = [
        {"path": str(minilm_dir), "name": "minilm", "prompts": SPEC_PROMPTS},
        {"path": str(reranker_dir), "name": "reranker"},
        {"path": str(classifier_dir), "name": "classifier"},
        {"path": str(splade_dir), "name": "splade"},
    ]
    with running_server({"TESSERA_MODELS": json.dumps(models), "TESSERA_THREADS": "2"}) as base:
        yield base
