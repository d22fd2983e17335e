from __future__ import annotations

import threading

import pytest
import torch

from featurestream import FeatureAlgorithm, LocalFeatureStore, SampleRef, StoreHandle
from featurestream.stores.ledger import location
from support.samples import eagle3_tensors, put_sample


def test_put_describes_a_contiguous_detached_copy() -> None:
    store = LocalFeatureStore()
    tensors = eagle3_tensors()
    ref = store.put("s0", tensors, run_id="r", num_tokens=4)
    assert ref.store_uri.startswith("mem://local-") and ref.store_uri == store.store_uri
    assert ref.algorithm is FeatureAlgorithm.EAGLE3 and ref.schema_version == 1
    assert ref.target_model_version == "0" and ref.draft_weight_version == "0" and ref.num_tokens == 4
    assert ref.estimated_bytes == sum(t.numel() * t.element_size() for t in tensors.values())
    tensors["input_ids"].fill_(-1)
    got, _ = store.get(ref)
    assert tuple(got) == ref.feature_names()
    assert (got["input_ids"] >= 0).all(), "the store must hold its own copy"
    got["input_ids"].fill_(-7)
    again, _ = store.get(ref)
    assert (again["input_ids"] >= 0).all(), "get must return copies the caller may mutate"


def test_store_uris_are_unique() -> None:
    assert LocalFeatureStore().store_uri != LocalFeatureStore().store_uri


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_samples": None, "max_bytes": None}, "at least one of max_samples / max_bytes"),
        ({"max_samples": 0}, "max_samples must be a positive int or None, got 0"),
        ({"max_bytes": -1}, "max_bytes must be a positive int or None, got -1"),
        ({"high_watermark_bytes": 10, "low_watermark_bytes": 10}, r"\(10\) must be strictly less than .*\(10\)"),
        ({"max_bytes": 100, "high_watermark_bytes": None, "low_watermark_bytes": 100}, "strictly less than"),
    ],
)
def test_config_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LocalFeatureStore(**kwargs)  # type: ignore[arg-type]


def test_watermark_defaults() -> None:
    store = LocalFeatureStore(max_bytes=1000, high_watermark_bytes=None, low_watermark_bytes=None)
    assert (store.high_watermark_bytes, store.low_watermark_bytes) == (1000, 0)


def test_put_errors_store_nothing() -> None:
    store = LocalFeatureStore(max_samples=1)
    with pytest.raises(ValueError, match="sample_id"):
        store.put("", eagle3_tensors())
    with pytest.raises(ValueError, match="non-empty mapping"):
        store.put("s", {})
    put_sample(store, "s0")
    with pytest.raises(ValueError, match="'s0' is already present"):
        put_sample(store, "s0")
    with pytest.raises(MemoryError, match="sample-count cap max_samples=1"):
        put_sample(store, "s1")
    assert store.health().sample_count == 1
    small = LocalFeatureStore(max_bytes=64, high_watermark_bytes=64, low_watermark_bytes=0)
    with pytest.raises(MemoryError, match="byte cap max_bytes=64"):
        put_sample(small, "big")
    assert small.health().resident_bytes == 0 and not small.is_resident("big")


def test_get_errors() -> None:
    store = LocalFeatureStore()
    other = LocalFeatureStore()
    ref = put_sample(store, "s0")
    with pytest.raises(KeyError, match="does not match this store's URI"):
        other.get(ref)
    _, handle = store.get(ref)
    store.release(handle)
    with pytest.raises(KeyError, match="not resident"):
        store.get(ref)


def test_get_detects_a_spec_mismatch() -> None:
    store = LocalFeatureStore()
    ref = put_sample(store, "s0")
    store._data[location(ref)]["input_ids"] = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="input_ids"):
        store.get(ref)


def test_release_counts_handles_and_is_idempotent() -> None:
    store = LocalFeatureStore()
    ref = put_sample(store, "s0")
    _, first = store.get(ref)
    _, second = store.get(ref)
    assert first.handle_id != second.handle_id
    store.release(first)
    store.release(first)
    assert store.is_resident("s0"), "one handle is still live"
    store.release(second)
    assert not store.is_resident("s0")
    assert store.health().resident_bytes == 0


def test_release_of_a_foreign_handle_is_refused() -> None:
    store, other = LocalFeatureStore(), LocalFeatureStore()
    ref = put_sample(store, "s0")
    _, handle = store.get(ref)
    with pytest.raises(ValueError, match="minted by a different store"):
        other.release(handle)
    forged = StoreHandle(store, "s0", ref, 999_999)
    store.release(forged)
    assert store.is_resident("s0")


def test_a_handle_built_without_an_id_gets_a_fresh_one_that_releases_nothing() -> None:
    store = LocalFeatureStore()
    ref = put_sample(store, "s0")
    _, real = store.get(ref)
    first, second = StoreHandle(store, "s0", ref), StoreHandle(store, "s0", ref)
    assert len({first.handle_id, second.handle_id, real.handle_id}) == 3
    store.release(first)
    assert store.is_resident("s0"), "a handle the store never minted must not release the real one"
    store.release(real)
    assert not store.is_resident("s0")


def test_health_watermarks() -> None:
    store = LocalFeatureStore(max_bytes=10_000, high_watermark_bytes=400, low_watermark_bytes=100)
    health = store.health()
    assert (health.resident_bytes, health.capacity_bytes, health.sample_count) == (0, 10_000, 0)
    assert health.low_watermark_hit and not health.high_watermark_hit
    ref = put_sample(store, "s0")
    assert ref.estimated_bytes >= 100
    health = store.health()
    assert health.resident_bytes == ref.estimated_bytes and health.sample_count == 1
    assert not health.low_watermark_hit
    for i in range(1, 5):
        put_sample(store, f"s{i}")
    assert store.health().high_watermark_hit


def test_retain_keeps_and_scrub_frees_whatever_the_handles() -> None:
    store = LocalFeatureStore()
    ref = put_sample(store, "s0")
    store.retain(ref)
    _, handle = store.get(ref)
    store.release(handle)
    assert store.is_resident("s0"), "a retained sample survives its last release"
    _, crashed = store.get(ref)
    store.scrub(ref)
    assert not store.is_resident("s0") and store.health().resident_bytes == 0
    assert store.gc() == 1, "gc sweeps the handle a crashed holder never released"
    store.release(crashed)
    assert store.gc() == 0


def test_close_frees_everything_and_refuses_later_use() -> None:
    store = LocalFeatureStore()
    ref = put_sample(store, "s0")
    store.get(ref)
    store.close()
    store.close()
    assert store.health().resident_bytes == 0 and store.health().sample_count == 0
    with pytest.raises(RuntimeError, match="closed"):
        put_sample(store, "s1")
    with pytest.raises(RuntimeError, match="closed"):
        store.get(ref)


def test_get_moves_to_device() -> None:
    store = LocalFeatureStore()
    ref = put_sample(store, "s0")
    got, _ = store.get(ref, device="cpu")
    assert all(t.device.type == "cpu" for t in got.values())


class _PausingStore(LocalFeatureStore):
    """Stops each bytes-freeing step that runs after the ledger's lock is released until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.unlocked = threading.Event()  # a drop is past the lock: its sample's bookkeeping is gone
        self.go_on = threading.Event()

    def _pause(self) -> None:
        self.unlocked.set()
        assert self.go_on.wait(timeout=30), "the test never let the drop go on"

    def _drop_released(self, ref: SampleRef) -> None:
        self._pause()
        super()._drop_released(ref)

    def _drop_scrubbed(self, ref: SampleRef) -> None:
        self._pause()
        super()._drop_scrubbed(ref)


@pytest.mark.parametrize("how", ["release", "scrub"])
def test_a_put_of_the_same_id_while_the_old_bytes_are_being_freed_keeps_its_bytes(how: str) -> None:
    store = _PausingStore()
    old = put_sample(store, "s0")
    _, handle = store.get(old)
    free, what = (store.release, handle) if how == "release" else (store.scrub, old)
    freeing = threading.Thread(target=free, args=(what,))
    freeing.start()
    assert store.unlocked.wait(timeout=30)
    new = store.put("s0", eagle3_tensors(seed=1), run_id="run")  # admitted: the old entry is forgotten already
    store.go_on.set()
    freeing.join(timeout=30)
    assert not freeing.is_alive()
    got, _ = store.get(new)
    assert torch.equal(got["aux_hidden_states"], eagle3_tensors(seed=1)["aux_hidden_states"])
    assert store.health().sample_count == 1
