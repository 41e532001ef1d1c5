"""Multi-modal text is tokenized by transformers' fast tokenizers, which keep truncation and padding settings
on one shared object and set them on every call, then encode. Requests are prepared on a pool of threads,
so one request's untruncated call must never land between another's settings and its encode (a text cut at
the model's limit would come back whole and fail the whole batch it lands in)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from core.config import ModelSpec
from core.loading import read_model_info
from core.tasks import create_task

LONG = "a photo of " + " ".join(["cat"] * 60)


@pytest.mark.parametrize("folder", ["clip_dir", "siglip_dir"])
def test_texts_prepared_on_two_threads_keep_their_own_truncation(folder, request, monkeypatch):
    path = request.getfixturevalue(folder)
    task = create_task("clip", read_model_info(path), ModelSpec(path=path))
    (alone,) = task.text_items([LONG], truncate=True)
    assert alone.cost == task.max_length  # cut at the limit when prepared alone

    # widen the window the race needs (between a call's settings and its encode) from microseconds to 2 ms,
    # on the real tokenizer: without a lock, the other thread's call then lands inside it every time
    cls = type(task.tokenizer)
    settings = cls.set_truncation_and_padding

    def slow_settings(self, *args, **kwargs):
        settings(self, *args, **kwargs)
        time.sleep(0.002)

    monkeypatch.setattr(cls, "set_truncation_and_padding", slow_settings)

    def long_text():  # an untruncated call, then a truncated one
        (item,) = task.text_items([LONG], truncate=True)
        return len(item.arrays["input_ids"])

    def short_texts():  # untruncated calls only
        return task.text_items(["red", "a photo of a cat", "blue"], truncate=True)

    lengths = []
    with ThreadPoolExecutor(2) as pool:
        for _ in range(30):
            a, b = pool.submit(long_text), pool.submit(short_texts)
            lengths.append(a.result())
            b.result()
    assert set(lengths) == {len(alone.arrays["input_ids"])}
