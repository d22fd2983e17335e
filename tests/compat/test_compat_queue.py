"""compat.md, queue: duplicate ids and misconfigured watermarks, in the reference's words."""

from __future__ import annotations

import pytest

from featurestream.queue import SampleRefQueue
from featurestream.stores.local import LocalFeatureStore

from .recipe import sample_tensors


@pytest.mark.parametrize("leased", [False, True], ids=["pending", "leased"])
@pytest.mark.parametrize("method", ["put", "put_blocks_until_below"])
def test_duplicate_id_on_put(method: str, leased: bool) -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    ref = store.put("s", sample_tensors(0))
    queue.put(ref)
    if leased:
        assert queue.acquire(timeout=0) is not None
    with pytest.raises(ValueError, match="already present"):
        getattr(queue, method)(ref)
    assert queue.pending_count() + queue.outstanding_count() == 1


@pytest.mark.parametrize(("high", "low"), [(100, 100), (100, 150)])
def test_misconfigured_watermarks(high: int, low: int) -> None:
    with pytest.raises(ValueError, match="strictly less than"):
        SampleRefQueue(LocalFeatureStore(), high_watermark_bytes=high, low_watermark_bytes=low)


@pytest.mark.parametrize(
    ("watermarks", "phrase"),
    [({"high_watermark_bytes": 0}, "high_watermark_bytes must be positive, got 0"),
     ({"high_watermark_bytes": -5}, "high_watermark_bytes must be positive, got -5"),
     ({"low_watermark_bytes": -1}, "low_watermark_bytes must be non-negative, got -1")],
)  # fmt: skip
def test_out_of_range_watermarks_in_both_backends(watermarks: dict[str, int], phrase: str) -> None:
    with pytest.raises(ValueError, match=phrase):
        SampleRefQueue(LocalFeatureStore(), **watermarks)
    redis_queue = pytest.importorskip("featurestream.backends.redis.queue", reason="redis-py is missing")
    # Arguments are checked before any connection: no server is needed to see the refusal.
    with pytest.raises(ValueError, match=phrase):
        redis_queue.RedisSampleRefQueue(LocalFeatureStore(), url="redis://127.0.0.1:1/0", name="q", **watermarks)
