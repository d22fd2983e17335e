"""``FeatureDataLoader(pin_memory=True)``: batches in page-locked host memory where CUDA exists; refused where not."""

from __future__ import annotations

import pytest
import torch

from featurestream import FeatureDataLoader, LocalFeatureStore, SampleRefQueue
from featurestream.testing import sample_tensors

CUDA = torch.cuda.is_available()


def sample(index: int) -> dict[str, torch.Tensor]:
    tensors = sample_tensors(index, 8)
    tensors["logits"] = torch.full((1, 8, 4), float(index))
    return tensors


def batches(pin_memory: bool, batch_size: int) -> list[dict[str, torch.Tensor]]:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    for index in range(4):
        queue.put(store.put(f"s{index}", sample(index)))
    queue.close()
    out = []
    with FeatureDataLoader(queue, store, prefetch=0, batch_size=batch_size, pin_memory=pin_memory) as loader:
        for batch in loader:
            tensors = {name: getattr(batch, name) for name in sample(0) if getattr(batch, name, None) is not None}
            out.append({name: (t.clone(), t.is_pinned()) for name, t in tensors.items()})
    return out


@pytest.mark.parametrize("batch_size", [1, 2])
def test_the_default_batches_are_in_plain_memory(batch_size: int) -> None:
    got = batches(False, batch_size)
    assert len(got) == 4 // batch_size and not any(pinned for batch in got for _, pinned in batch.values())


def test_pin_memory_without_cuda_is_refused_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    store = LocalFeatureStore()
    with pytest.raises(RuntimeError, match=r"pin_memory=True needs CUDA.*leave pin_memory=False"):
        FeatureDataLoader(SampleRefQueue(store), store, pin_memory=True)
    with pytest.raises(TypeError, match="pin_memory"):
        FeatureDataLoader(SampleRefQueue(store), store, pin_memory="yes")  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine: pinned memory is for copies to a GPU")
@pytest.mark.parametrize("batch_size", [1, 2])
def test_pin_memory_batches_are_pinned_and_hold_the_same_bytes(batch_size: int) -> None:
    plain, pinned = batches(False, batch_size), batches(True, batch_size)
    assert all(is_pinned for batch in pinned for _, is_pinned in batch.values())
    for a, b in zip(plain, pinned, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[name][0], b[name][0]) for name in a)
    moved = pinned[0]["logits"][0].to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(moved.cpu(), plain[0]["logits"][0])
