"""Batch operations on the Redis backend: one server call each, every item settled or rejected on its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from featurestream import LocalFeatureStore
from featurestream import VisibilityTimeout as VT
from featurestream.backends.memory.queue import SampleRefQueue
from featurestream.common.refs import SampleRef
from featurestream.core import events
from featurestream.core.coordinator import Coordinator
from featurestream.core.effects import Effects
from featurestream.core.protocol import LeaseQueue
from featurestream.testing import FakeClock, sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py

Factory = Callable[..., RedisSampleRefQueue]


def refs(store: LocalFeatureStore, count: int, first: int = 0) -> list[SampleRef]:
    return [store.put(f"s{i}", sample_tensors(i)) for i in range(first, first + count)]


def fcalls(client: redis.Redis) -> int:
    """How many FCALLs the server has run: its own count, so 'one round trip' is measured, not assumed."""
    return int(client.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))


def test_each_batch_operation_is_one_server_call(redis_server: Any, make: Factory, store: LocalFeatureStore) -> None:
    queue = make(store)
    client = redis.Redis.from_url(redis_server.url)
    try:
        before = fcalls(client)
        queue.put_many(refs(store, 8))
        leases = queue.acquire_many(8, timeout=0)
        queue.ack_many(leases[:5])
        queue.fail_many(leases[5:])
        assert fcalls(client) - before == 4
    finally:
        client.close()
    stats = queue.stats()
    assert (stats.put, stats.leased, stats.acked, stats.failed, stats.pending) == (8, 8, 5, 3, 3)
    assert [lease.ref.sample_id for lease in leases] == [f"s{i}" for i in range(8)]  # FIFO
    assert store.health().sample_count == 3


def test_acquire_many_returns_what_is_there_up_to_n(make: Factory, store: LocalFeatureStore) -> None:
    queue = make(store)
    assert queue.acquire_many(4, timeout=0) == []
    queue.put_many(refs(store, 3))
    first = queue.acquire_many(2, timeout=0)
    rest = queue.acquire_many(4, timeout=5)  # one is available: returned at once, not after the timeout
    assert [lease.ref.sample_id for lease in first + rest] == ["s0", "s1", "s2"]
    assert len({lease.lease_id for lease in first + rest}) == 3
    with pytest.raises(ValueError, match="n must be an int >= 1, got 0"):
        queue.acquire_many(0)
    with pytest.raises(ValueError, match="True"):
        queue.acquire_many(True)


def test_stale_leases_in_a_batch_are_rejected_one_by_one(make: Factory, store: LocalFeatureStore) -> None:
    clock = FakeClock(1000.0)
    queue = make(store, clock=clock, visibility_timeout=VT(10.0))
    other = make(store, clock=clock, visibility_timeout=VT(10.0))
    queue.put_many(refs(store, 4))
    mine = queue.acquire_many(3, timeout=0)
    foreign = other.acquire(timeout=0)
    queue.ack(mine[0])  # already settled: stale in the batch
    queue.ack_many([mine[0], mine[1], foreign, mine[2]])  # type: ignore[list-item]
    stats = queue.stats()
    assert (stats.acked, stats.stale_rejected, stats.outstanding) == (3, 2, 1)
    assert store.is_resident("s3") and not any(store.is_resident(f"s{i}") for i in range(3))
    other.fail_many([foreign, mine[1]])  # type: ignore[list-item]  # mine[1]: settled, and not other's
    assert other.stats().failed == 1 and other.stats().stale_rejected == 3 and other.pending_count() == 1
    again = queue.acquire(timeout=0)
    queue.ack_many([again, again])  # type: ignore[list-item]  # the second is stale, as a second ack() is
    assert (queue.stats().acked, queue.stats().stale_rejected) == (4, 4)
    with pytest.raises(ValueError, match="at most 1000 items"):
        queue.ack_many([again] * 1001)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="at most 1000"):
        queue.acquire_many(1001)


def test_put_many_is_all_or_nothing(make: Factory, store: LocalFeatureStore) -> None:
    queue = make(store)
    queue.put(refs(store, 1)[0])
    queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    batch = refs(store, 3)  # s0 again: acked recently
    before = store.health()
    with pytest.raises(ValueError, match="'s0' was already acked"):
        queue.put_many(batch)
    stats = queue.stats()
    assert (stats.put, stats.pending, stats.dedup_refused) == (1, 0, 1)
    assert store.health() == before  # every retain undone
    queued = refs(store, 2, first=5)
    queue.put_many(queued)
    fresh = refs(store, 1, first=7)[0]
    with pytest.raises(ValueError, match="'s6' is already present"):
        queue.put_many([fresh, queued[1]])
    assert queue.pending_count() == 2 and queue.stats().put == 3
    for ref in (fresh, queued[1]):
        store.release(store.get(ref)[1])
    # The refused s7 is back to plain residency (freed on its last release); the queued s6 kept its retain.
    assert not store.is_resident("s7") and store.is_resident("s6")
    with pytest.raises(ValueError, match="'s9' appears twice"):
        queue.put_many(refs(store, 1, first=9) * 2)
    with pytest.raises(TypeError):
        queue.put_many([refs(store, 1, first=10)[0], "s11"])  # type: ignore[list-item]
    queue.close()
    with pytest.raises(RuntimeError, match="closed"):
        queue.put_many(refs(store, 1, first=12))
    assert queue.stats().put == 3


def test_a_batch_is_traced_as_its_items_each_with_the_state_it_left(make: Factory, store: LocalFeatureStore) -> None:
    trace: list[tuple[str, dict[str, object]]] = []
    queue = make(store, tracer=lambda action, fields: trace.append((action, fields)), max_deliveries=1)
    queue.put_many(refs(store, 2))
    leases = queue.acquire_many(2, timeout=0)
    queue.ack_many(leases[:1])
    queue.fail_many(leases[1:])
    ids = [lease.lease_id for lease in leases]
    # (action, sample, lease, redelivery count n, pending, outstanding): as one call per item would trace them
    assert [
        (action, f["sample_id"], f.get("lease_id"), f["n"], f["pending"], f["outstanding"]) for action, f in trace
    ] == [
        (events.PUT, "s0", None, 0, 1, 0),
        (events.PUT, "s1", None, 0, 2, 0),
        (events.ACQUIRE, "s0", ids[0], 0, 1, 1),
        (events.ACQUIRE, "s1", ids[1], 0, 0, 2),
        (events.ACK, "s0", ids[0], 0, 0, 1),
        (events.FAIL, "s1", ids[1], 0, 0, 0),
        (events.DEAD_LETTER, "s1", None, 0, 0, 0),
    ]
    # The server's clock: one now per call, never going back; a lease's deadline is its call's now + 10 s.
    nows = [fields["now"] for _, fields in trace]
    assert nows == sorted(nows) and nows[0] == nows[1] and nows[2] == nows[3]
    assert [f["deadline"] for a, f in trace if a == events.ACQUIRE] == [nows[2] + 10.0] * 2


@pytest.mark.parametrize("backend", ["in-process", "redis"])
@pytest.mark.parametrize("op", ["ack", "fail"])
def test_a_batch_of_live_and_stale_leases_is_traced_item_by_item(
    make: Factory, store: LocalFeatureStore, backend: str, op: str
) -> None:
    # As the calls one at a time would trace it, on both backends: the stateful kit compares the trace with
    # the spec mirror's per-item steps (the Redis server once traced a batch's stale leases first).
    trace: list[str] = []
    hooks: dict[str, Any] = {"tracer": lambda action, fields: trace.append(action)}
    queue: LeaseQueue
    if backend == "redis":
        queue, other = make(store, **hooks), make(store)
    else:
        queue, other = SampleRefQueue(store, **hooks), SampleRefQueue(LocalFeatureStore())
    queue.put_many(refs(store, 3))
    mine = queue.acquire_many(3, timeout=0)
    queue.ack(mine[0])
    other.put(refs(other.store, 1, first=9)[0])
    foreign = other.acquire(timeout=0)
    del trace[:]
    getattr(queue, f"{op}_many")([mine[0], mine[1], foreign, mine[2], mine[1]])
    settle = events.ACK if op == "ack" else events.FAIL
    stale = events.STALE_REJECTED
    assert [a for a in trace if a in (settle, stale)] == [stale, settle, stale, settle, stale]


# The public members each backend defines beyond the LeaseQueue protocol. A new public method is a contract
# change: add it here (and to the protocol if every backend offers it).
BEYOND_PROTOCOL = {
    SampleRefQueue: {"lease_state_counts", "training_ledger"},
    RedisSampleRefQueue: {"delete", "disconnect", "lease_state_counts", "open", "training_ledger"},
}


@pytest.mark.parametrize("backend", list(BEYOND_PROTOCOL), ids=lambda cls: cls.__name__)
def test_each_backend_implements_the_protocol_itself(backend: type) -> None:
    protocol = {name for name in [*vars(LeaseQueue), *LeaseQueue.__annotations__] if not name.startswith("_")}
    defined = {name for cls in (backend, Coordinator) for name in vars(cls) if not name.startswith("_")}
    # max_deliveries and dedup_window are instance attributes; everything else the class or the coordinator defines.
    assert protocol - defined == {"max_deliveries", "dedup_window"}
    assert defined - protocol == BEYOND_PROTOCOL[backend]
    # The shared coordinator (and its effects half) only, never another backend.
    assert backend.__mro__ == (backend, Coordinator, Effects, object)
