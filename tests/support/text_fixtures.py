"""Session fixtures for the text-task model folders (imported by tests/tasks and tests/compat conftests)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from tests.support.cache import cached_build
from tests.support import text_models

_SOURCE = Path(text_models.__file__)


@pytest.fixture(scope="session")
def reranker_dir(minilm_dir) -> Path:
    return cached_build("tiny-reranker", [_SOURCE], partial(text_models.build_reranker, minilm_dir))


@pytest.fixture(scope="session")
def st_cross_encoder_dir(reranker_dir) -> Path:
    return cached_build("tiny-st-cross-encoder", [_SOURCE], partial(text_models.build_st_cross_encoder, reranker_dir))


@pytest.fixture(scope="session")
def classifier_dir(minilm_dir) -> Path:
    return cached_build("tiny-classifier", [_SOURCE], partial(text_models.build_classifier, minilm_dir))


@pytest.fixture(scope="session")
def multilabel_dir(minilm_dir) -> Path:
    return cached_build("tiny-multilabel", [_SOURCE], partial(text_models.build_multilabel_classifier, minilm_dir))


@pytest.fixture(scope="session")
def colbert_dir(minilm_dir) -> Path:
    return cached_build("tiny-colbert", [_SOURCE], partial(text_models.build_colbert, minilm_dir))


@pytest.fixture(scope="session")
def prompts_dir(minilm_dir) -> Path:
    """MiniLM with prompts and include_prompt=false (prompt tokens left out of mean pooling)."""
    return cached_build("minilm-prompts-excluded", [_SOURCE],
                        partial(text_models.build_minilm_with_prompts, minilm_dir, include_prompt=False))


@pytest.fixture(scope="session")
def splade_dir() -> Path:
    return text_models.splade_dir()
