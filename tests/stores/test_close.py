"""``close()`` of a store instance frees only what no queue holds: a queued sample stays readable until the queue
scrubs it (``docs/data-plane.md``; spec/OrphanReclaim.tla's ``WriterClose``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from featurestream import LocalFeatureStore, SampleRefQueue, SharedDirFeatureStore
from featurestream.stores.arena import entries
from featurestream.testing import sample_tensors


def unlinked(directory: Path) -> list[str]:
    """``entries(directory)`` once the background unlinks of scrubbed files are done (a closed writer's scrub hands
    its file to a deleter nobody waits for)."""
    deadline = time.monotonic() + 10
    while any(name.startswith(".scrubbed-") for name in entries(directory)) and time.monotonic() < deadline:
        time.sleep(0.005)
    return entries(directory)


def test_a_closed_local_store_keeps_its_queued_sample_readable_until_the_ack() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    queued, loose = store.put("s0", sample_tensors(0)), store.put("s1", sample_tensors(1))
    queue.put(queued)
    _, handle = store.get(queued)
    store.close()
    store.close()
    assert store.health().sample_count == 1 and store.is_resident("s0") and not store.is_resident("s1")
    with pytest.raises(RuntimeError, match="closed"):
        store.get(loose)
    with pytest.raises(RuntimeError, match="closed"):
        store.put("s2", sample_tensors(2))
    store.release(handle)  # a handle outliving close is a no-op: the queue still holds the sample
    lease = queue.acquire(timeout=1)
    assert lease is not None and lease.ref.sample_id == "s0"
    tensors, handle = store.get(lease.ref)
    assert torch.equal(tensors["input_ids"], sample_tensors(0)["input_ids"])
    store.release(handle)
    assert queue.ack(lease)
    assert store.health().sample_count == 0 and store.health().resident_bytes == 0


def test_a_closed_writer_leaves_queued_files_to_other_instances_and_frees_the_rest(tmp_path: Path) -> None:
    writer, trainer = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
    queue = SampleRefQueue(writer)
    queued = writer.put("s0", sample_tensors(0))
    writer.put("s1", sample_tensors(1))
    queue.put(queued)
    _, handle = writer.get(queued)
    writer.close()
    left = sorted(entries(tmp_path))
    stem = os.path.basename(writer.data_path(queued))[: -len(".safetensors")]
    assert left == ["s0.safetensors", f"{stem}.retained", f"{stem}.safetensors"], "s1 went; s0's files stay"
    writer.release(handle)
    tensors, handle = trainer.get(queued)
    assert torch.equal(tensors["aux_hidden_states"], sample_tensors(0)["aux_hidden_states"])
    trainer.release(handle)  # a queued sample survives a reader's last release, too
    lease = queue.acquire(timeout=1)
    assert lease is not None and queue.ack(lease)  # the scrub, through the closed writer
    trainer.close()
    assert unlinked(tmp_path) == []


def test_a_sample_queued_through_another_instance_survives_its_writers_close(tmp_path: Path) -> None:
    writer, trainer = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
    queue = SampleRefQueue(trainer)  # retains (the marker) in the trainer's instance, not the writer's
    ref = writer.put("s0", sample_tensors(0))
    queue.put(ref)
    writer.close()
    lease = queue.acquire(timeout=1)
    assert lease is not None
    tensors, handle = trainer.get(lease.ref)
    assert torch.equal(tensors["input_ids"], sample_tensors(0)["input_ids"])
    trainer.release(handle)
    assert queue.ack(lease)
    trainer.close()
    assert entries(tmp_path) == []
