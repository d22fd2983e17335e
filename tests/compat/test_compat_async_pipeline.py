"""compat.md, async_pipeline: PromptSource is a runtime-checkable Protocol; stop's keyword-only join_timeout."""

from __future__ import annotations

import inspect
from typing import Protocol

import featurestream
from featurestream.async_pipeline import AsyncFeaturePipeline, PromptSource
from featurestream.producer import FeatureProducer
from featurestream.queue import SampleRefQueue
from featurestream.stores.local import LocalFeatureStore

from .recipe import EchoTarget, prompt


def test_prompt_source_is_a_runtime_checkable_protocol_exported_from_the_root() -> None:
    assert featurestream.PromptSource is PromptSource
    assert isinstance(PromptSource, type) and issubclass(PromptSource, Protocol)  # type: ignore[arg-type]
    assert isinstance(lambda: None, PromptSource)
    assert not isinstance(42, PromptSource)


def test_stop_join_timeout_is_keyword_only_defaulting_to_ten_seconds_and_accepts_none() -> None:
    parameter = inspect.signature(AsyncFeaturePipeline.stop).parameters["join_timeout"]
    assert parameter.kind is inspect.Parameter.KEYWORD_ONLY and parameter.default == 10.0
    assert "None" in str(parameter.annotation)


def test_stop_with_join_timeout_none_returns_once_the_thread_has_ended() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    producer = FeatureProducer(EchoTarget(), store, run_id="r")
    pipeline = AsyncFeaturePipeline(producer, queue, iter([prompt()["input_ids"]]))
    pipeline.start()
    pipeline.stop(join_timeout=None)
    assert not pipeline.is_running and queue.is_closed
