"""``RedisSampleRefQueue.lose``: a lost sample is dead-lettered at once with the in-process queue's reason."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from featurestream import LocalFeatureStore
from featurestream.common.errors import SettledSample
from featurestream.core.lease import LOST_REASON
from featurestream.testing import sample_tensors


def test_lose_dead_letters_at_once_keeps_no_bytes_and_rejects_a_stale_lease(make: Callable[..., Any]) -> None:
    store = LocalFeatureStore()
    queue = make(store, max_deliveries=5, keep_dead_letter_bytes=1 << 20)
    queue.put(store.put("s1", sample_tensors(1)))
    queue.put(store.put("s2", sample_tensors(2)))
    lease = queue.acquire(timeout=1)
    assert lease is not None and lease.ref.sample_id == "s1"
    assert queue.lose(lease) is True
    assert queue.lose(lease) is False
    [letter] = queue.dead_letters()
    assert (letter.ref.sample_id, letter.reason, letter.deliveries) == ("s1", LOST_REASON, 1)
    assert not store.is_resident("s1"), "a lost sample's dead letter keeps no bytes"
    stats = queue.stats()
    assert (stats.dead_lettered, stats.pending, stats.outstanding) == (1, 1, 0)
    with pytest.raises(SettledSample, match="dead-lettered"):  # the dedup window refuses it like any dead letter
        queue.put(store.put("s1", sample_tensors(1)))
