"""``give_back``: a lease handed back unused is pending again and spends none of ``max_deliveries``."""

from __future__ import annotations

import pytest

from featurestream import LocalFeatureStore, SampleRefQueue, VisibilityTimeout
from featurestream.core.events import GIVE_BACK
from support.samples import put_sample


def test_a_given_back_lease_keeps_its_redelivery_count_and_a_poisoned_sample_dies_after_real_failures() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store, VisibilityTimeout(30.0), max_deliveries=3)
    queue.put(put_sample(store, "poison"))
    for real_failure in range(3):
        for _ in range(2):  # two loaders prefetch it and close without using it
            lease = queue.acquire(timeout=1)
            assert lease is not None and lease.redelivery_count == real_failure
            assert queue.give_back(lease) is True
        lease = queue.acquire(timeout=1)
        assert lease is not None and lease.redelivery_count == real_failure
        assert queue.fail(lease) is True
    [letter] = queue.dead_letters()
    assert (letter.ref.sample_id, letter.deliveries) == ("poison", 3)
    assert letter.reason == "failed 3 times (max_deliveries=3)"
    stats = queue.stats()
    assert (stats.given_back, stats.failed, stats.leased, stats.pending, stats.outstanding) == (6, 3, 9, 0, 0)
    assert not store.is_resident("poison")


def test_a_stale_give_back_changes_nothing_and_a_batch_gives_back_each_live_lease_in_order() -> None:
    store = LocalFeatureStore()
    traced: list[tuple[str, dict[str, object]]] = []
    queue = SampleRefQueue(
        store, VisibilityTimeout(30.0), tracer=lambda action, fields: traced.append((action, fields))
    )
    for sample_id in ("a", "b", "c"):
        queue.put(put_sample(store, sample_id))
    first = queue.acquire(timeout=1)
    assert first is not None and queue.ack(first) is True
    assert queue.give_back(first) is False, "an acked lease is stale"
    leases = queue.acquire_many(2, timeout=1)
    queue.give_back_many([leases[1], first, leases[0]])
    assert [fields["sample_id"] for action, fields in traced if action == GIVE_BACK] == ["c", "b"]
    assert [queue.acquire(timeout=1).ref.sample_id for _ in range(2)] == ["c", "b"]  # type: ignore[union-attr]
    stats = queue.stats()
    assert (stats.acked, stats.given_back, stats.stale_rejected, stats.outstanding) == (1, 2, 2, 2)
    with pytest.raises(TypeError):
        queue.give_back_many([leases[0], "not a lease"])  # type: ignore[list-item]
    assert queue.stats().given_back == 2, "a batch with a non-lease gives back none of them"
