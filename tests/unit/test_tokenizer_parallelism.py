"""``tokenizer_parallelism``: where the settings reach the models, the tokenizers library's own threads are
switched off (the default: requests tokenize in parallel, each on one thread) or on."""

from __future__ import annotations

import pytest

from core.config import Settings
from core.engine import Registry


@pytest.mark.parametrize("enabled, value", [(False, "false"), (True, "true")])
def test_the_registry_sets_the_libraries_switch(monkeypatch, enabled, value):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "unset-by-the-test")
    Registry.from_settings(Settings(models=[], tokenizer_parallelism=enabled))
    import os

    assert os.environ["TOKENIZERS_PARALLELISM"] == value


def test_the_default_is_off_and_an_env_var_sets_it(monkeypatch):
    assert Settings(models=[]).tokenizer_parallelism is False
    monkeypatch.setenv("TESSERA_TOKENIZER_PARALLELISM", "true")
    assert Settings(models=[]).tokenizer_parallelism is True
