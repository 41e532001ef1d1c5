import json

import pytest

from tests.support.server import running_server
from tests.support import text_fixtures as _fixtures

# the session fixtures of the text-task model folders
reranker_dir = _fixtures.reranker_dir
st_cross_encoder_dir = _fixtures.st_cross_encoder_dir
classifier_dir = _fixtures.classifier_dir
multilabel_dir = _fixtures.multilabel_dir
colbert_dir = _fixtures.colbert_dir
prompts_dir = _fixtures.prompts_dir
splade_dir = _fixtures.splade_dir

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
