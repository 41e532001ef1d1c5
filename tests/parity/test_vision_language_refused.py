"""Vision–language embedders (the Qwen2-VL layout of GME, jina-embeddings-v4 and Qwen3-VL-Embedding) are not
implemented: a folder of that architecture is refused at load with the reason and the alternative, never served
as a text encoder (whose mean-pooled vectors would differ from the model card's chat-template, last-token ones)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from core.config import ModelSpec, Settings
from core.engine import Engine
from core.errors import Unsupported
from tests.support import family_models, text_models
from tests.support.cache import cached_build


@pytest.mark.parametrize("task", ["auto", "embed"])
def test_qwen2_vl_folder_is_refused_by_name(minilm_dir, task):
    folder = cached_build("tiny-qwen2-vl", [Path(family_models.__file__), Path(text_models.__file__)],
                          partial(family_models.build_qwen2_vl, minilm_dir))
    with pytest.raises(Unsupported, match="'qwen2_vl' is a vision–language model.*model card's code"):
        Engine.load(ModelSpec(path=folder, backend="torch", task=task), Settings(threads=2))
