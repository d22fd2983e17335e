"""The README's "Using it" block, run as written: a producer thread and two slow consumers past the store's caps, and
a sample whose training step always fails (logged, dead-lettered, and the run ends in ``SystemExit``)."""

from __future__ import annotations

import logging
import pathlib
import re
import threading
import time
from collections.abc import Callable

import pytest
import torch

from featurestream import LocalFeatureStore, SampleRefQueue
from featurestream.common.refs import REQUIRED_FEATURES, REQUIRED_SUPERVISION, FeatureAlgorithm
from featurestream.stores.ledger import DEFAULT_MAX_SAMPLES

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
POISONED = "sample-7"


def _using_it_block() -> str:
    text = README.read_text()
    section = text[text.index("## Using it\n") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the 'Using it' section should hold exactly one python block"
    return blocks[0]


def _run_block(
    monkeypatch: pytest.MonkeyPatch, edit: Callable[[str, dict[str, torch.Tensor]], None]
) -> tuple[dict[str, object], list[BaseException]]:
    """Exec the block with every ``LocalFeatureStore.get`` slowed by 2 ms (slower consumers than the producer: the
    store fills to its sample-count cap) and its features passed through ``edit(sample_id, features)``."""
    original_get = LocalFeatureStore.get

    def slow_get(self: LocalFeatureStore, ref: object, *args: object, **kwargs: object) -> tuple[object, object]:
        features, handle = original_get(self, ref, *args, **kwargs)  # type: ignore[arg-type]
        time.sleep(0.002)
        edit(ref.sample_id, features)  # type: ignore[attr-defined]
        return features, handle

    monkeypatch.setattr(LocalFeatureStore, "get", slow_get)
    crashed: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: crashed.append(args.exc_value))
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(compile(_using_it_block(), str(README), "exec"), namespace)
    return namespace, crashed


def test_the_readme_pattern_completes_with_slow_consumers_past_the_sample_cap(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    namespace, crashed = _run_block(monkeypatch, lambda sample_id, features: None)

    assert crashed == [], f"a thread of the README example raised: {crashed!r}"
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    store, queue = namespace["store"], namespace["queue"]
    assert isinstance(store, LocalFeatureStore) and isinstance(queue, SampleRefQueue)
    assert store.max_samples == DEFAULT_MAX_SAMPLES  # the default store, not one with the cap lifted
    stats = queue.stats()
    assert stats.acked == 200 > DEFAULT_MAX_SAMPLES and stats.failed == stats.dead_lettered == 0
    assert stats.producer_pauses > 0  # the count cap, not luck, held the producer back
    assert queue.lifecycle_state == "drained"
    assert store.health().sample_count == 0
    head = namespace["draft_head"]
    assert isinstance(head, torch.nn.Module)
    assert all(p.grad is not None for p in head.parameters()), "train_step ran backward through the draft head"


def test_a_failing_step_is_logged_redelivered_dead_lettered_and_fails_the_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def poison(sample_id: str, features: dict[str, torch.Tensor]) -> None:
        if sample_id == POISONED:
            del features["logits"]  # train_step raises KeyError on this sample, every delivery

    caplog.set_level(logging.ERROR, logger="train")
    with pytest.raises(SystemExit, match=r"^1 samples dead-lettered \(199 trained\): see the logged errors$"):
        _run_block(monkeypatch, poison)

    failures = [r for r in caplog.records if r.name == "train" and r.levelno == logging.ERROR]
    assert [r.getMessage() for r in failures] == [
        f"train_step failed on {POISONED} (delivery {n})" for n in range(1, 6)
    ], "each of the max_deliveries=5 failures is logged once, in order"
    for record in failures:
        assert record.exc_info is not None and isinstance(record.exc_info[1], KeyError)
        assert "KeyError: 'logits'" in caplog.text


def test_the_readme_names_every_required_eagle3_feature_and_its_supervision() -> None:
    block = _using_it_block()
    for name in REQUIRED_FEATURES[FeatureAlgorithm.EAGLE3]:
        assert f'"{name}"' in block
    assert any(
        all(f'"{name}"' in block for name in encoding) for encoding in REQUIRED_SUPERVISION[FeatureAlgorithm.EAGLE3]
    )
    section = README.read_text().split("## Using it\n", 1)[1].split("```python", 1)[0]
    for encoding in REQUIRED_SUPERVISION[FeatureAlgorithm.EAGLE3]:
        assert all(f"`{name}`" in section for name in encoding), "the prose lists each supervision encoding"
