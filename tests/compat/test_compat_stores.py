"""compat.md, stores: the same exception types and phrases from the local and the shared-dir store."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest

from featurestream.store import FeatureStore, StoreHandle
from featurestream.stores.local import LocalFeatureStore
from featurestream.stores.shared_dir import SharedDirFeatureStore

from .recipe import sample_tensors

StoreFactory = Callable[..., FeatureStore]


@pytest.fixture(params=["local", "shared_dir"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "local":
        return LocalFeatureStore
    counter = iter(range(1000))
    return lambda **kwargs: SharedDirFeatureStore(tmp_path / f"dir{next(counter)}", **kwargs)


def test_neither_cap_set(make_store: StoreFactory) -> None:
    with pytest.raises(ValueError, match="at least one of max_samples / max_bytes"):
        make_store(max_samples=None, max_bytes=None)


def test_low_watermark_not_below_high(make_store: StoreFactory) -> None:
    with pytest.raises(ValueError, match="strictly less than"):
        make_store(high_watermark_bytes=100, low_watermark_bytes=100)
    with pytest.raises(ValueError, match="strictly less than"):
        make_store(high_watermark_bytes=100, low_watermark_bytes=200)


def test_duplicate_sample_id(make_store: StoreFactory) -> None:
    store = make_store()
    store.put("s", sample_tensors(0))
    with pytest.raises(ValueError, match="already present"):
        store.put("s", sample_tensors(1))


def test_put_over_the_sample_cap(make_store: StoreFactory) -> None:
    store = make_store(max_samples=1)
    store.put("a", sample_tensors(0))
    with pytest.raises(MemoryError, match="sample-count cap"):
        store.put("b", sample_tensors(1))


def test_put_over_the_byte_cap(make_store: StoreFactory) -> None:
    store = make_store(max_samples=None, max_bytes=64, high_watermark_bytes=None, low_watermark_bytes=None)
    with pytest.raises(MemoryError, match="byte cap"):
        store.put("big", sample_tensors(0))


def test_get_of_a_ref_from_another_store(make_store: StoreFactory) -> None:
    ref = make_store().put("s", sample_tensors(0))
    with pytest.raises(KeyError, match="does not match this store's URI"):
        make_store().get(ref)


def test_release_of_a_handle_from_another_store(make_store: StoreFactory) -> None:
    store = make_store()
    _, handle = store.get(store.put("s", sample_tensors(0)))
    with pytest.raises(ValueError, match="different store"):
        make_store().release(handle)


@pytest.mark.parametrize("sample_id", ["../up", "a/b", "x..y", "nul\0"])
def test_shared_dir_id_that_would_escape_the_directory(tmp_path: Path, sample_id: str) -> None:
    with pytest.raises(ValueError, match="escape the store directory"):
        SharedDirFeatureStore(tmp_path).put(sample_id, sample_tensors(0))


def test_store_handle_without_handle_id_gets_a_fresh_one() -> None:
    store = LocalFeatureStore()
    ref = store.put("s", sample_tensors(0))
    first, second = StoreHandle(store, "s", ref), StoreHandle(store, "s", ref)
    assert isinstance(first.handle_id, int) and first.handle_id != second.handle_id


def test_put_declares_take_ownership_keyword_only_default_false() -> None:
    for put in (FeatureStore.put, LocalFeatureStore.put, SharedDirFeatureStore.put):
        parameter = inspect.signature(put).parameters["take_ownership"]
        assert parameter.kind is parameter.KEYWORD_ONLY and parameter.default is False
