"""A malformed entry in a Redis queue's pending list (not ``<n><TAB><sample id>``, written by something other than
the queue's functions) is moved aside once: kept with its raw bytes in the queue's ``malformed`` list as a dead
letter of reason ``malformed``, logged once, never leased and never surfaced to a consumer as an error."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from featurestream import LocalFeatureStore
from featurestream.testing import sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py

MALFORMED = [b"no tab at all", b"\xff\xfe not text\tand no count", b"12\t", b"\tno count"]


@pytest.mark.parametrize("traced", [False, True])
def test_malformed_entries_are_moved_aside_once_and_the_good_ones_delivered(
    make: Callable[..., RedisSampleRefQueue],
    redis_client: redis.Redis,
    queue_name: str,
    caplog: pytest.LogCaptureFixture,
    traced: bool,
) -> None:
    store = LocalFeatureStore()
    events: list[tuple[str, dict[str, object]]] = []
    queue = make(store, **({"tracer": lambda action, fields: events.append((action, fields))} if traced else {}))
    prefix = f"featurestream:{{{queue_name}}}:"
    queue.put(store.put("s0", sample_tensors(0)))
    redis_client.rpush(prefix + "pending", *MALFORMED)
    queue.put(store.put("s1", sample_tensors(1)))
    with caplog.at_level(logging.WARNING, logger="featurestream.backends.redis.engine"):
        leased = [queue.acquire(timeout=0) for _ in range(3)]
        assert queue.acquire(timeout=0) is None
    assert [lease.ref.sample_id for lease in leased if lease is not None] == ["s0", "s1"] and leased[2] is None
    assert redis_client.llen(prefix + "pending") == 0
    assert redis_client.lrange(prefix + "malformed", 0, -1) == [b"malformed\t" + raw for raw in MALFORMED]
    logged = [record.getMessage() for record in caplog.records if "malformed" in record.getMessage()]
    assert len(logged) == len(MALFORMED), logged
    for raw, message in zip(MALFORMED, logged, strict=True):
        assert repr(raw) in message and queue_name in message
    for lease in leased:
        if lease is not None:
            queue.ack(lease)
    stats = queue.stats()
    assert (stats.acked, stats.pending, stats.outstanding, stats.dead_lettered) == (2, 0, 0, 0)
    assert queue.dead_letters() == [], "the queue's own dead letters (refs) are not mixed with raw entries"
    assert not traced or [fields["sample_id"] for action, fields in events if action == "Acquire"] == ["s0", "s1"]
