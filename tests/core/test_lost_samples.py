"""Lost bytes: a sample whose bytes the store lost is dead-lettered at once with reason ``lost``, never redelivered."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from featurestream import (
    FeatureDataLoader,
    LocalFeatureStore,
    SampleLostError,
    SampleRefQueue,
    SharedDirFeatureStore,
)
from featurestream.core.lease import LOST_REASON
from featurestream.stores.arena import entries
from featurestream.testing import FaultyStore
from support.samples import eagle3_tensors
from support.schema_cases import drain_through_loader


def sample(index: int) -> dict[str, torch.Tensor]:
    tensors = eagle3_tensors(seed=index)
    tensors["logits"] = torch.zeros(1, 4, 16)  # what the loader's schema needs for supervision
    return tensors


def test_a_lost_sample_is_dead_lettered_once_through_the_loader_and_the_rest_are_trained() -> None:
    store = FaultyStore(LocalFeatureStore())
    queue = SampleRefQueue(store, max_deliveries=5)
    for index in range(3):
        queue.put(store.put(f"s{index}", sample(index)))
    store.lose("s1")
    queue.close()
    trained, raised = drain_through_loader(queue, store, SampleLostError)
    assert trained == ["s0", "s2"]
    assert [exc.sample_id for exc in raised] == ["s1"] and "injected loss" in str(raised[0])  # type: ignore[attr-defined]
    [letter] = queue.dead_letters()
    assert (letter.ref.sample_id, letter.reason, letter.deliveries) == ("s1", LOST_REASON, 1)
    stats = queue.stats()
    assert (stats.acked, stats.dead_lettered, stats.pending, stats.outstanding) == (2, 1, 0, 0)
    assert queue.lifecycle_state == "drained" and store.inner.health().sample_count == 0


def test_lose_on_a_stale_lease_changes_nothing_and_a_lost_letter_is_never_kept() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store, keep_dead_letter_bytes=1 << 20)
    queue.put(store.put("s1", sample(1)))
    lease = queue.acquire(timeout=1)
    assert lease is not None and queue.lose(lease) is True
    assert queue.lose(lease) is False and len(queue.dead_letters()) == 1
    assert not store.is_resident("s1"), "a lost sample's dead letter keeps no bytes"
    with pytest.raises(TypeError, match="lose"):
        queue.lose("s1")  # type: ignore[arg-type]


@pytest.mark.parametrize("wiped", [False, True], ids=["file-deleted", "file-and-marker-deleted"])
def test_a_shared_dir_file_deleted_under_the_queue_is_dead_lettered_lost_at_its_first_read(
    tmp_path: Path, wiped: bool
) -> None:
    """An operator deletes a queued sample's file (``wiped``: its queued marker too): the store says lost (naming the
    path) or not resident, and the loader dead-letters it at once either way, with ``max_deliveries`` to spare."""
    store = SharedDirFeatureStore(tmp_path)
    queue = SampleRefQueue(store, max_deliveries=10)
    refs = [store.put(f"s{index}", sample(index)) for index in range(3)]
    queue.put_many(refs)
    path = store.data_path(refs[1])
    os.unlink(path)
    if wiped:
        os.unlink(path[: -len(".safetensors")] + ".retained")
    queue.close()
    trained, raised = drain_through_loader(queue, store, SampleLostError)
    assert trained == ["s0", "s2"]
    assert [exc.sample_id for exc in raised] == ["s1"] and path in str(raised[0])
    [letter] = queue.dead_letters()
    assert (letter.ref.sample_id, letter.reason, letter.deliveries) == ("s1", LOST_REASON, 1)
    assert queue.stats().acked == 2 and queue.lifecycle_state == "drained"
    store.close()
    assert entries(tmp_path) == [], "the lost sample's marker and link went with its dead letter"


def test_a_ref_of_another_store_is_failed_back_not_dead_lettered_lost() -> None:
    """A trainer given the wrong store must not turn every sample into a lost dead letter: the bytes are fine."""
    store, other = LocalFeatureStore(), LocalFeatureStore()
    queue = SampleRefQueue(store, max_deliveries=3)
    queue.put(store.put("s0", sample(0)))
    with FeatureDataLoader(queue, other, prefetch=0, close_queue=False) as loader:
        with pytest.raises(KeyError, match="does not match") as raised:
            next(loader)
    assert not isinstance(raised.value, SampleLostError)
    assert queue.dead_letters() == [] and queue.pending_count() == 1, "failed back for a consumer of the right store"
