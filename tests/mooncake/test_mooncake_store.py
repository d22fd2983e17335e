"""``MooncakeFeatureStore`` against a real ``mooncake_master``: the store contract, lost and corrupt bytes."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from featurestream import CorruptSampleError, SampleLostError, SampleRefQueue
from featurestream.common.refs import FeatureSpec
from featurestream.testing import make_queue_machine, sample_tensors
from featurestream.tools.mooncake import MooncakeMaster

MakeStore = Callable[..., Any]


def _equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return list(got) == list(want) and all(torch.equal(got[name], want[name]) for name in want)


def test_round_trip_is_bit_exact_between_instances_and_store_uri_names_cluster_and_run(
    make_store: MakeStore, mooncake_master: MooncakeMaster, namespace: str
) -> None:
    producer, trainer = make_store(), make_store(global_segment_size=0)
    tensors = sample_tensors(3, tokens=7)
    tensors["aux_hidden_states"] = torch.randn(1, 7, 4).to(torch.bfloat16)
    ref = producer.put("s3", tensors)
    assert ref.store_uri == f"mooncake://{mooncake_master.master_server_address}/{namespace}"
    got, handle = trainer.get(ref)
    assert _equal(got, tensors)
    got["input_ids"].add_(1)  # the caller owns what get returned
    again, other = trainer.get(ref)
    assert _equal(again, tensors)
    trainer.release(handle)
    trainer.release(other)
    assert producer.is_resident("s3"), "a reader's release never frees a sample it did not write"
    other_run = make_store(namespace=namespace + "-other")
    with pytest.raises(KeyError, match="does not match this store's URI"):
        other_run.get(ref)


def test_writer_residency_follows_scrubs_and_caps_made_in_another_process(make_store: MakeStore) -> None:
    producer = make_store(max_samples=2, max_bytes=None, high_watermark_bytes=1000, low_watermark_bytes=100)
    trainer = make_store(global_segment_size=0)
    first = producer.put("s1", sample_tensors(1, tokens=10))  # 400 B
    producer.retain(first)
    second = producer.put("s2", sample_tensors(2, tokens=20))  # 800 B
    producer.retain(second)
    health = producer.health()
    assert (health.sample_count, health.resident_bytes, health.high_watermark_hit) == (2, 1200, True)
    with pytest.raises(MemoryError, match="max_samples=2"):
        producer.put("s3", sample_tensors(3))
    _, handle = trainer.get(second)
    trainer.release(handle)
    assert producer.health().sample_count == 2, "a queued sample survives a reader's release"
    trainer.scrub(second)
    health = producer.health()
    assert (health.sample_count, health.resident_bytes, health.high_watermark_hit) == (1, 400, False)
    assert not producer.is_resident("s2")
    producer.put("s3", sample_tensors(3))  # the freed slot is usable again


def test_a_put_refused_by_stale_counters_asks_the_master_first(make_store: MakeStore) -> None:
    """A put within the caps makes no master call for them; one the counters would refuse counts again first."""
    producer = make_store(max_samples=2, max_bytes=None, high_watermark_bytes=10_000, low_watermark_bytes=100)
    trainer = make_store(global_segment_size=0)
    client, asked = producer._client, []

    class Counting:  # the producer's client, counting the existence checks it sends the master
        def __getattr__(self, name: str) -> object:
            if name == "batch_is_exist":
                asked.append(name)
            return getattr(client, name)

    producer._client = Counting()
    refs = [producer.put("s0", sample_tensors(0, tokens=10))]  # (its first put claims a residency slot)
    asked.clear()
    refs.append(producer.put("s1", sample_tensors(1, tokens=10)))
    assert asked == [], "a put within the caps asks the master nothing about them"
    for ref in refs:
        producer.retain(ref)
        trainer.scrub(ref)  # in another instance: the producer's counters still hold both
    second = producer.put("s2", sample_tensors(2, tokens=10))  # at max_samples=2 by the counters, not by Mooncake
    assert asked == ["batch_is_exist"]
    producer.retain(second)
    trainer.scrub(second)
    again = producer.put("s2", sample_tensors(3, tokens=10))  # the id again, once scrubbed elsewhere
    assert trainer.get(again)[0]["input_ids"].equal(sample_tensors(3, tokens=10)["input_ids"])
    producer.put("s3", sample_tensors(4, tokens=10))
    with pytest.raises(MemoryError, match="max_samples=2"):
        producer.put("s4", sample_tensors(5, tokens=10))  # Mooncake holds s2 and s3: still refused
    with pytest.raises(ValueError, match="already present"):
        producer.put("s3", sample_tensors(6, tokens=10))
    assert producer.health().sample_count == 2


def test_release_frees_an_unqueued_sample_and_scrub_frees_a_queued_one(make_store: MakeStore) -> None:
    store = make_store()
    ref = store.put("s1", sample_tensors(1))
    _, handle = store.get(ref)
    store.release(handle)
    assert not store.is_resident("s1")
    with pytest.raises(KeyError):
        store.get(ref)
    ref = store.put("s1", sample_tensors(1))
    store.retain(ref)
    _, handle = store.get(ref)
    store.release(handle)
    assert store.is_resident("s1")
    store.scrub(ref)
    assert store.health().sample_count == 0
    store.release(handle)  # idempotent, frees nothing


def test_a_stale_ref_of_an_earlier_incarnation_never_serves_or_scrubs_the_new_one(make_store: MakeStore) -> None:
    producer, trainer = make_store(), make_store(global_segment_size=0)
    old = producer.put("s1", sample_tensors(1))
    producer.retain(old)
    trainer.scrub(old)
    new = producer.put("s1", sample_tensors(5, tokens=2))
    producer.retain(new)
    assert old.feature_keys != new.feature_keys
    with pytest.raises(KeyError):
        trainer.get(old)
    trainer.scrub(old)  # a stale scrub of the earlier put
    got, handle = trainer.get(new)
    assert _equal(got, sample_tensors(5, tokens=2))
    trainer.release(handle)


def test_bytes_that_vanish_raise_sample_lost_error_naming_sample_and_cause(make_store: MakeStore) -> None:
    producer, trainer = make_store(), make_store(global_segment_size=0)
    ref = producer.put("s1", sample_tensors(1))
    producer.retain(ref)
    # What an eviction or a dead segment owner does: the object is gone from the master, nobody scrubbed it.
    assert producer._client.remove(producer.object_key(ref), True) == 0
    with pytest.raises(SampleLostError) as raised:
        trainer.get(ref)
    assert raised.value.sample_id == "s1" and "lost" in str(raised.value) and "segment" in raised.value.cause
    assert isinstance(raised.value, KeyError)


def test_reads_that_do_not_match_the_ref_raise_corrupt_sample_error(make_store: MakeStore) -> None:
    store = make_store()
    ref = store.put("s1", sample_tensors(1, tokens=4))
    specs = dict(ref.feature_specs)
    specs["aux_hidden_states"] = FeatureSpec((1, 4, 1), torch.float32)  # fewer bytes than stored
    with pytest.raises(CorruptSampleError, match="larger than"):
        store.get(dataclasses.replace(ref, feature_specs=specs))
    specs["aux_hidden_states"] = FeatureSpec((1, 4, 8), torch.float32)  # more bytes than stored
    with pytest.raises(CorruptSampleError, match="truncated"):
        store.get(dataclasses.replace(ref, feature_specs=specs))
    # Same size, another incarnation's header: the bytes of some other put.
    forged = {name: key.replace(key.split("@")[1].split("/")[0], "0" * 32) for name, key in ref.feature_keys.items()}
    raw = torch.zeros(32 + ref.estimated_bytes, dtype=torch.uint8)
    key = store.object_key(dataclasses.replace(ref, feature_keys=forged))
    assert store._client.put_from(key, raw.data_ptr(), raw.numel(), store._config) == 0
    with pytest.raises(CorruptSampleError, match="header"):
        store.get(dataclasses.replace(ref, feature_keys=forged))
    _, handle = store.get(ref)  # failed reads leave the sample as it was
    store.release(handle)


def test_close_waits_for_queued_samples_then_refuses_naming_them(make_store: MakeStore) -> None:
    producer, trainer = make_store(close_timeout=0.2), make_store(global_segment_size=0)
    ref = producer.put("s1", sample_tensors(1))
    producer.retain(ref)
    with pytest.raises(RuntimeError, match=r"'s1'.*dedicated storage process"):
        producer.close()
    got, handle = trainer.get(ref)  # nothing was closed
    assert _equal(got, sample_tensors(1))
    trainer.release(handle)
    trainer.scrub(ref)
    producer.close()
    with pytest.raises(RuntimeError, match="closed"):
        producer.put("s2", sample_tensors(2))


def test_config_file_and_bad_arguments(make_store: MakeStore, mooncake_master: MooncakeMaster, tmp_path: Path) -> None:
    from featurestream import MooncakeFeatureStore

    config = tmp_path / "mooncake.json"
    kwargs = mooncake_master.store_kwargs(global_segment_size=16 << 20, local_buffer_size=16 << 20, device_name="")
    config.write_text(json.dumps({k: v for k, v in kwargs.items()}))
    store = MooncakeFeatureStore.from_config_file(config, namespace="from-file", close_timeout=0)
    try:
        assert store.store_uri == f"mooncake://{mooncake_master.master_server_address}/from-file"
        ref = store.put("s1", sample_tensors(1))
        got, handle = store.get(ref)
        assert _equal(got, sample_tensors(1))
        store.release(handle)
    finally:
        store.close()
    with pytest.raises(ValueError, match="global_segment_size must be an int >= 0, got -1"):
        make_store(global_segment_size=-1)
    with pytest.raises(ValueError, match="namespace 'a@b' may not contain '@'"):
        make_store(namespace="a@b")


def test_queue_machine_over_the_mooncake_store(
    make_store: MakeStore, mooncake_master: MooncakeMaster, namespace: str
) -> None:
    from featurestream import MooncakeFeatureStore

    class AbandoningStore(MooncakeFeatureStore):
        """The machine's teardown abandons its run with samples still queued: drop them."""

        def close(self, *, force: bool = True) -> None:
            super().close(force=force)

    runs = iter(range(1 << 30))
    host = make_store()  # one Mooncake client (and segment) shared by every run's store

    def store() -> MooncakeFeatureStore:
        # A namespace per run: a fresh, empty store each time, as the machine requires.
        kwargs = mooncake_master.store_kwargs(client=host._client, namespace=f"{namespace}-{next(runs)}")
        return AbandoningStore(**kwargs, max_samples=64)

    make_queue_machine(store, SampleRefQueue, name="MooncakeMachine").TestCase("runTest").runTest()


def test_get_reuses_a_read_buffer_only_once_nothing_references_it(make_store: MakeStore) -> None:
    producer, trainer = make_store(), make_store(global_segment_size=0)
    first, second = producer.put("s1", sample_tensors(1)), producer.put("s2", sample_tensors(2))

    def block_of(tensors: dict[str, torch.Tensor]) -> int:
        return tensors["input_ids"].untyped_storage().data_ptr()

    got, handle = trainer.get(first)
    kept_view, first_block = got["input_ids"][:, :2], block_of(got)  # a view outlives the dict and the handle
    trainer.release(handle)
    del got
    other, handle = trainer.get(second)
    second_block = block_of(other)
    assert second_block != first_block, "a block still referenced was handed out again"
    assert torch.equal(kept_view, sample_tensors(1)["input_ids"][:, :2])
    trainer.release(handle)
    del other, kept_view
    again, handle = trainer.get(first)
    # The pool keeps both blocks alive, so no fresh allocation can land on either: this is a reuse.
    assert block_of(again) in {first_block, second_block}
    assert _equal(again, sample_tensors(1))
    trainer.release(handle)
