"""A handle of an earlier incarnation of a sample id never frees a later one (every ledger store)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from featurestream import DeadLetter, FeatureStore, LocalFeatureStore, SampleRefQueue, SharedDirFeatureStore
from featurestream.stores.arena import entries
from support.samples import eagle3_tensors


@pytest.fixture(params=["local", "shared-dir"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], FeatureStore]:
    if request.param == "local":
        return LocalFeatureStore
    return lambda: SharedDirFeatureStore(tmp_path / "store")


def test_a_stale_release_after_scrub_and_re_put_leaves_the_new_incarnation(
    make_store: Callable[[], FeatureStore],
) -> None:
    store = make_store()
    old = store.put("s1", eagle3_tensors(seed=1))
    store.retain(old)
    _, stale = store.get(old)
    store.scrub(old)  # e.g. FeatureProducer.discard; no gc() in between
    new = store.put("s1", eagle3_tensors(seed=2))
    store.release(stale)
    assert store.is_resident("s1"), "the earlier incarnation's handle freed the new sample"
    got, handle = store.get(new)
    assert torch.equal(got["aux_hidden_states"], eagle3_tensors(seed=2)["aux_hidden_states"])
    store.release(handle)
    assert not store.is_resident("s1"), "the new incarnation's own last handle still frees it"


def test_a_ref_of_an_earlier_incarnation_never_serves_retains_or_scrubs_a_later_one(
    make_store: Callable[[], FeatureStore],
) -> None:
    store = make_store()
    old = store.put("s1", eagle3_tensors(seed=1))
    store.scrub(old)
    new = store.put("s1", eagle3_tensors(seed=2))
    with pytest.raises(KeyError, match="s1"):
        store.get(old)
    store.retain(old)  # marks nothing of the new incarnation ...
    store.scrub(old)  # ... and frees nothing of it
    assert store.is_resident("s1")
    got, handle = store.get(new)
    assert torch.equal(got["aux_hidden_states"], eagle3_tensors(seed=2)["aux_hidden_states"])
    store.release(handle)
    assert not store.is_resident("s1"), "the new incarnation was never retained, so its last release frees it"


def test_a_stale_reader_in_another_instance_never_frees_a_re_put_sample(tmp_path: Path) -> None:
    reader, writer = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
    old = writer.put("s1", eagle3_tensors(seed=1))
    writer.retain(old)
    _, stale = reader.get(old)
    writer.scrub(old)  # acked elsewhere
    new = writer.put("s1", eagle3_tensors(seed=2))  # not retained: no marker protects it
    reader.release(stale)  # the reader's last handle of the old incarnation
    assert writer.is_resident("s1") and os.path.exists(writer.data_path(new))
    with pytest.raises(KeyError, match="s1"):
        reader.get(old)
    got, handle = reader.get(new)
    assert torch.equal(got["aux_hidden_states"], eagle3_tensors(seed=2)["aux_hidden_states"])
    reader.release(handle)
    assert not os.path.exists(writer.data_path(new)), "the new incarnation's own last release still frees it"


def test_an_id_re_put_before_a_stale_reader_releases_is_delivered_through_the_queue(tmp_path: Path) -> None:
    """No dedup window, so the id may be queued again once acked: a stale release must spare the new file, even
    before the queue's marker protects it."""
    writer, stale_reader, reader = (SharedDirFeatureStore(tmp_path) for _ in range(3))
    dead: list[DeadLetter] = []
    queue = SampleRefQueue(writer, dedup_window=0, on_dead_letter=dead.append)
    queue.put(writer.put("s1", eagle3_tensors(seed=1)))
    first = queue.acquire(timeout=0)
    assert first is not None
    _, stale = stale_reader.get(first.ref)
    queue.ack(first)
    again = writer.put("s1", eagle3_tensors(seed=2))  # the producer's put; its queue.put (the marker) follows
    stale_reader.release(stale)
    queue.put(again)
    second = queue.acquire(timeout=0)
    assert second is not None and second.ref.sample_id == "s1"
    got, handle = reader.get(second.ref)
    assert torch.equal(got["aux_hidden_states"], eagle3_tensors(seed=2)["aux_hidden_states"])
    reader.release(handle)
    queue.ack(second)
    writer.close()
    assert dead == [] and queue.stats().acked == 2
    assert entries(tmp_path) == []
