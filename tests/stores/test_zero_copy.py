"""The stores' explicit zero-copy options, and that the defaults still copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from featurestream import LocalFeatureStore, SharedDirFeatureStore
from support.helpers import assert_is_sample, eagle3_sample


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_local_defaults_copy_on_put_and_on_get() -> None:
    store = LocalFeatureStore()
    given = eagle3_sample(1)
    ref = store.put("s", given)
    got, _ = store.get(ref)
    again, _ = store.get(ref)
    assert not any(same_memory(got[n], given[n]) or same_memory(got[n], again[n]) for n in given)


def test_local_take_ownership_keeps_the_callers_tensors() -> None:
    store = LocalFeatureStore()
    given = eagle3_sample(1)
    ref = store.put("s", given, take_ownership=True)
    shared, _ = store.get(ref, copy=False)
    assert all(same_memory(shared[n], given[n]) for n in given), "no copy on either side"
    private, _ = store.get(ref)
    assert not any(same_memory(private[n], given[n]) for n in given), "the default get still copies"
    private["logits"].zero_()
    assert_is_sample(store.get(ref)[0], 1)


def test_take_ownership_densifies_strided_and_detaches() -> None:
    store = LocalFeatureStore()
    tensors = eagle3_sample(2)
    tensors["aux_hidden_states"] = tensors["aux_hidden_states"].transpose(1, 2).contiguous().transpose(1, 2)
    tensors["logits"] = tensors["logits"].clone().requires_grad_()
    ref = store.put("s", tensors, take_ownership=True)
    got, _ = store.get(ref, copy=False)
    assert got["aux_hidden_states"].is_contiguous() and not got["logits"].requires_grad
    assert_is_sample({n: t.detach() for n, t in got.items()}, 2)


def test_shared_dir_copy_false_maps_the_file_and_a_write_never_reaches_it(tmp_path: Path) -> None:
    store = SharedDirFeatureStore(tmp_path)
    ref = store.put("s", eagle3_sample(3), take_ownership=True)
    first, _ = store.get(ref, copy=False)
    with pytest.raises(RuntimeError, match=r"inference tensor"):
        first["logits"].zero_()
    assert_is_sample(store.get(ref)[0], 3)
    private, _ = store.get(ref)
    private["logits"].zero_()  # the default get copies: the caller's to mutate
    assert_is_sample(store.get(ref, copy=False)[0], 3)
