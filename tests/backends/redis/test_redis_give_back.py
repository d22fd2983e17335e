"""``RedisSampleRefQueue.give_back``: an unused lease goes back with its redelivery count, across instances."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from featurestream import LocalFeatureStore
from featurestream.testing import sample_tensors


def test_give_back_keeps_the_count_rejects_a_stale_lease_and_another_instance_sees_it(
    make: Callable[..., Any],
) -> None:
    store = LocalFeatureStore()
    queue = make(store, max_deliveries=2)
    other = make(store, max_deliveries=2)
    queue.put(store.put("poison", sample_tensors(1)))
    queue.put(store.put("good", sample_tensors(2)))
    failed = queue.acquire(timeout=1)
    assert failed is not None and failed.ref.sample_id == "poison" and queue.fail(failed)
    for _ in range(3):  # given back three times: still one delivery spent
        leases = other.acquire_many(2, timeout=1)
        assert [(lease.ref.sample_id, lease.redelivery_count) for lease in leases] == [("good", 0), ("poison", 1)]
        other.give_back_many(leases)
    assert other.give_back(leases[0]) is False, "a lease given back is stale"
    stats = queue.stats()
    assert (stats.given_back, stats.failed, stats.stale_rejected, stats.pending, stats.outstanding) == (6, 1, 1, 2, 0)
    lease = queue.acquire_many(2, timeout=1)[1]
    assert (lease.ref.sample_id, lease.redelivery_count) == ("poison", 1)
    assert queue.fail(lease)
    [letter] = queue.dead_letters()
    assert (letter.ref.sample_id, letter.deliveries) == ("poison", 2)
