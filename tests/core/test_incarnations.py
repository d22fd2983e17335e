"""A handle of an earlier incarnation of a sample id never frees a later one (every ledger store)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from featurestream import FeatureStore, LocalFeatureStore, SharedDirFeatureStore

from .samples import eagle3_tensors


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
