"""The README's "Using it" block, run as written: a producer thread and two slow consumers past the store's caps."""

from __future__ import annotations

import pathlib
import re
import threading
import time

import torch

from featurestream import LocalFeatureStore, SampleRefQueue
from featurestream.core.refs import REQUIRED_FEATURES, FeatureAlgorithm
from featurestream.stores.ledger import DEFAULT_MAX_SAMPLES

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _using_it_block() -> str:
    text = README.read_text()
    section = text[text.index("## Using it\n") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the 'Using it' section should hold exactly one python block"
    return blocks[0]


def test_the_readme_pattern_completes_with_slow_consumers_past_the_sample_cap() -> None:
    trained: list[str] = []
    lock = threading.Lock()
    crashed: list[BaseException] = []

    def train_step(features: dict[str, torch.Tensor]) -> None:
        time.sleep(0.002)  # slower than the producer: the store fills to its sample-count cap
        with lock:
            trained.append(str(features["input_ids"].shape))

    original_hook = threading.excepthook
    threading.excepthook = lambda args: crashed.append(args.exc_value)  # type: ignore[assignment]
    namespace: dict[str, object] = {"train_step": train_step, "__name__": "readme_example"}
    try:
        exec(compile(_using_it_block(), str(README), "exec"), namespace)
    finally:
        threading.excepthook = original_hook

    assert crashed == [], f"a thread of the README example raised: {crashed!r}"
    store, queue = namespace["store"], namespace["queue"]
    assert isinstance(store, LocalFeatureStore) and isinstance(queue, SampleRefQueue)
    assert store.max_samples == DEFAULT_MAX_SAMPLES  # the default store, not one with the cap lifted
    stats = queue.stats()
    assert stats.acked == len(trained) == 200 > DEFAULT_MAX_SAMPLES
    assert stats.producer_pauses > 0  # the count cap, not luck, held the producer back
    assert queue.lifecycle_state == "drained"
    assert store.health().sample_count == 0


def test_the_readme_names_every_required_eagle3_feature() -> None:
    block = _using_it_block()
    for name in REQUIRED_FEATURES[FeatureAlgorithm.EAGLE3]:
        assert f'"{name}"' in block
