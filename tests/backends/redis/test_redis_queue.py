"""RedisSampleRefQueue against a real redis-server: every method, and stale acks across instances."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from featurestream import (
    DeadLetter,
    Lease,
    LeaseLost,
    LocalFeatureStore,
    SampleRefQueue,
    SharedDirFeatureStore,
    StoreHealth,
)
from featurestream import VisibilityTimeout as VT
from featurestream.common import errors
from featurestream.core.protocol import LeaseQueue
from featurestream.spec.recording import TraceRecorder
from featurestream.testing import FakeClock, sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.link import FIRST_CONTACT_TIMEOUT, NotRedisServer, RedisUnreachable  # noqa: E402
from featurestream.backends.redis.queue import RedisLease, RedisSampleRefQueue  # noqa: E402 - needs redis-py

Factory = Callable[..., RedisSampleRefQueue]


@pytest.fixture
def store() -> LocalFeatureStore:
    return LocalFeatureStore(max_samples=64)


@pytest.fixture
def queue_defaults(clock: FakeClock) -> dict[str, Any]:
    return {"visibility_timeout": VT(10.0), "clock": clock}


def put(store: LocalFeatureStore, queue: RedisSampleRefQueue, index: int, prefix: str = "s") -> Any:
    ref = store.put(f"{prefix}{index}", sample_tensors(index))
    queue.put(ref)
    return ref


def test_fifo_lease_ack_and_scrub(make: Factory, store: LocalFeatureStore, clock: FakeClock) -> None:
    queue = make(store)
    refs = [put(store, queue, i) for i in range(3)]
    assert (queue.pending_count(), queue.outstanding_count()) == (3, 0)
    leases = [queue.acquire(timeout=0) for _ in range(3)]
    assert [lease.ref for lease in leases] == refs  # type: ignore[union-attr]
    lease = leases[0]
    assert isinstance(lease, RedisLease) and isinstance(lease, Lease)
    assert lease.deadline == clock() + 10.0 and lease.redelivery_count == 0
    assert len({lease.lease_id for lease in leases}) == 3  # type: ignore[union-attr]
    assert queue.acquire(timeout=0) is None and not queue.is_closed
    # A queued sample survives its consumer's release (retained) ...
    _, handle = store.get(lease.ref)
    store.release(handle)
    assert store.is_resident("s0")
    # ... and is scrubbed on ack even with a handle still out.
    store.get(lease.ref)
    queue.ack(lease)
    assert not store.is_resident("s0")
    assert queue.stats() == dataclasses.replace(queue.stats(), put=3, leased=3, acked=1, pending=0, outstanding=2)
    assert queue.lease_state_counts() == {"pending": 0, "leased": 2}


def test_fail_redelivers_from_the_tail_then_dead_letters(make: Factory, store: LocalFeatureStore) -> None:
    letters: list[DeadLetter] = []
    queue = make(store, max_deliveries=2, on_dead_letter=letters.append)
    put(store, queue, 0)
    first = queue.acquire(timeout=0)
    put(store, queue, 1)
    queue.fail(first)  # type: ignore[arg-type]
    assert queue.acquire(timeout=0).ref.sample_id == "s1"  # type: ignore[union-attr]
    again = queue.acquire(timeout=0)
    assert again.ref.sample_id == "s0" and again.redelivery_count == 1  # type: ignore[union-attr]
    assert again.lease_id != first.lease_id  # type: ignore[union-attr]
    queue.fail(again)  # type: ignore[arg-type]
    assert [(d.ref.sample_id, d.reason, d.deliveries) for d in queue.dead_letters()] == [
        ("s0", "failed 2 times (max_deliveries=2)", 2)
    ]
    assert letters == queue.dead_letters()
    assert not store.is_resident("s0")
    stats = queue.stats()
    assert (stats.failed, stats.dead_lettered, stats.outstanding, stats.pending) == (2, 1, 1, 0)


def test_dead_letter_callback_errors_are_logged(
    make: Factory, store: LocalFeatureStore, caplog: pytest.LogCaptureFixture
) -> None:
    def explode(_: DeadLetter) -> None:
        raise RuntimeError("callback bug")

    queue = make(store, max_deliveries=1, on_dead_letter=explode)
    put(store, queue, 0)
    queue.fail(queue.acquire(timeout=0))  # type: ignore[arg-type]
    assert "callback bug" in caplog.text and queue.stats().dead_lettered == 1


@pytest.mark.parametrize("make_stale", ["twice", "copy", "made_up_id", "core_lease", "other_instance"])
def test_stale_leases_are_rejected_without_changes(make: Factory, store: LocalFeatureStore, make_stale: str) -> None:
    queue = make(store)
    other = make(store)
    put(store, queue, 0)
    lease = queue.acquire(timeout=0)
    assert lease is not None
    if make_stale == "twice":
        queue.ack(lease)
    stale: Any = {
        "twice": lease,
        "copy": dataclasses.replace(lease),
        "made_up_id": dataclasses.replace(lease, lease_id=lease.lease_id + 1000),
        "core_lease": Lease(lease.ref, lease.deadline, lease.visibility_timeout, lease_id=lease.lease_id),
        "other_instance": lease,
    }[make_stale]
    target = other if make_stale == "other_instance" else queue
    before = target.stats()
    assert target.ack(stale) is False
    assert target.fail(stale) is False
    with pytest.raises(LeaseLost):
        target.extend(stale)
    after = target.stats()
    assert after == dataclasses.replace(before, stale_rejected=before.stale_rejected + 3)
    assert store.is_resident("s0") == (make_stale != "twice")
    if make_stale != "twice":
        queue.ack(lease)  # the real lease is still live
        assert queue.stats().acked == 1


@pytest.mark.parametrize("not_a_lease", [None, "not a lease", 7, {"lease_id": 1}])
def test_a_non_lease_is_a_type_error_naming_it_and_changes_nothing(
    make: Factory, store: LocalFeatureStore, not_a_lease: object
) -> None:
    queue = make(store)
    put(store, queue, 0)
    lease = queue.acquire(timeout=0)
    assert lease is not None
    before = queue.stats()
    for call in (queue.ack, queue.fail, queue.extend):
        with pytest.raises(TypeError, match=f"expects a Lease.*{type(not_a_lease).__name__}"):
            call(not_a_lease)  # type: ignore[operator]
    for batch_call in (queue.ack_many, queue.fail_many):
        with pytest.raises(TypeError, match="expects a Lease"):
            batch_call([lease, not_a_lease])  # type: ignore[list-item]  # the live lease first: still not acked
    assert queue.stats() == before and queue.outstanding_count() == 1
    assert queue.ack(lease) is True


def test_a_stale_ack_is_logged_once_per_lease(
    make: Factory, store: LocalFeatureStore, caplog: pytest.LogCaptureFixture
) -> None:
    queue = make(store)
    put(store, queue, 0)
    lease = queue.acquire(timeout=0)
    assert lease is not None and queue.ack(lease) is True
    with caplog.at_level("WARNING", logger="featurestream.backends.redis.queue"):
        assert [queue.ack(lease), queue.ack(lease), queue.fail(lease)] == [False, False, False]
    lines = [r.getMessage() for r in caplog.records if "stale" in r.getMessage()]
    assert len(lines) == 1 and f"lease {lease.lease_id}" in lines[0] and "'s0'" in lines[0]
    assert queue.stats().stale_rejected == 3


def test_late_ack_of_a_reclaimed_lease_changes_nothing_across_instances(make: Factory, clock: FakeClock) -> None:
    """Two instances (two connections, as two processes would be), each with its own store view."""
    store = LocalFeatureStore()
    slow, fast = make(store), make(store)
    put(store, slow, 0)
    old = slow.acquire(timeout=0)
    clock.advance(10.0)  # the lease expires; the next call anywhere reclaims it
    new = fast.acquire(timeout=0)
    assert new is not None and new.ref.sample_id == "s0" and new.redelivery_count == 1
    stats = fast.stats()
    assert (stats.reclaimed, stats.outstanding) == (1, 1)
    slow.ack(old)  # type: ignore[arg-type]
    slow.fail(old)  # type: ignore[arg-type]
    with pytest.raises(LeaseLost, match="is not live"):
        slow.extend(old)  # type: ignore[arg-type]
    assert slow.stats() == dataclasses.replace(stats, stale_rejected=3)
    assert store.is_resident("s0")
    fast.ack(new)
    assert fast.stats().acked == 1 and not store.is_resident("s0")


def test_the_server_checks_the_token(make: Factory, store: LocalFeatureStore) -> None:
    """A peer that knows the lease id but not its token cannot settle it (the Lua check, not the local one)."""
    queue = make(store)
    put(store, queue, 0)
    lease = queue.acquire(timeout=0)
    assert lease is not None
    key = f"{lease.lease_id:016d}"
    for forged_token in ("0" * 16, lease.token[:-1], ""):
        statuses, _ = queue._engine._run("ack", key, forged_token, "s0")
        assert statuses == [b"stale"]
    assert queue.outstanding_count() == 1 and queue.stats().stale_rejected == 3
    statuses, _ = queue._engine._run("ack", key, lease.token, "s0")
    assert statuses == [b"ok"]


def test_put_rejects_bad_input_and_changes_nothing(make: Factory, store: LocalFeatureStore) -> None:
    queue = make(store)
    ref = put(store, queue, 0)
    before = queue.stats()
    with pytest.raises(TypeError, match="put expects a SampleRef"):
        queue.put("s0")  # type: ignore[arg-type]
    foreign = LocalFeatureStore().put("x", sample_tensors(0))
    with pytest.raises(ValueError, match="lives in mem://"):
        queue.put(foreign)
    with pytest.raises(ValueError, match="'s0' is already present: it is already queued"):
        queue.put(ref)
    assert queue.stats() == before


def test_dedup_window_refuses_settled_ids_and_is_bounded(make: Factory, store: LocalFeatureStore) -> None:
    queue = make(store, dedup_window=2)
    refs = [put(store, queue, i) for i in range(3)]
    for _ in refs:
        queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'s2' was already acked"):
        queue.put(refs[2])
    assert queue.stats().dedup_refused == 1
    with pytest.raises(ValueError, match="'s0' is not resident"):
        queue.put(refs[0])  # evicted from the window of 2, but its bytes were scrubbed at its ack
    put(store, queue, 0)  # stored anew: accepted
    assert queue.stats().put == 4


def test_settings_are_fixed_by_the_first_instance(make: Factory, store: LocalFeatureStore) -> None:
    make(store, max_deliveries=3)
    with pytest.raises(ValueError, match="created with max_deliveries=3, dedup_window=100000"):
        make(store, max_deliveries=4)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"name": ""}, ValueError, "name must be a non-empty str"),
        ({"name": "a{b}"}, ValueError, "without braces"),
        ({"reconnect_timeout": -1}, ValueError, "reconnect_timeout"),
        ({"reaper_interval": 0}, ValueError, "reaper_interval must be > 0"),
        ({"clock": 5}, TypeError, "clock must be a callable"),
        ({"client": object()}, TypeError, "client must be a redis.Redis"),
        ({"max_deliveries": 0}, ValueError, "max_deliveries"),
        ({"high_watermark_bytes": 10, "low_watermark_bytes": 10}, ValueError, "hysteresis band"),
    ],
)
def test_misconfiguration(
    redis_server: Any, store: LocalFeatureStore, kwargs: dict[str, Any], error: type, match: str
) -> None:
    if "client" not in kwargs:
        kwargs["url"] = redis_server.url
    with pytest.raises(error, match=match):
        RedisSampleRefQueue(store, **kwargs)


@pytest.mark.parametrize("layout", ["2", "3"])
def test_a_queue_of_another_key_layout_is_refused_and_left_as_it_was(
    redis_server: Any, queue_name: str, store: LocalFeatureStore, layout: str
) -> None:
    """A queue an older version made (layout 2: deliveries in a stream; 3: positional lease and dead-letter
    records) is named, not read or changed."""
    meta = f"featurestream:{{{queue_name}}}:meta"
    client = redis.Redis.from_url(redis_server.url)
    old = {"state": "open", "layout": layout, "max_deliveries": "5", "dedup_window": "10000", "keep_bytes": "0"}
    client.hset(meta, mapping=old)
    with pytest.raises(ValueError, match=rf"key layout '{layout}'; this version reads layout '4' \(drain it with"):
        RedisSampleRefQueue(store, url=redis_server.url, name=queue_name)
    assert {k.decode(): v.decode() for k, v in client.hgetall(meta).items()} == old
    assert client.keys(f"featurestream:{{{queue_name}}}:*") == [meta.encode()]
    client.close()


def test_url_and_client_are_exclusive(redis_server: Any, store: LocalFeatureStore) -> None:
    with pytest.raises(ValueError, match="either url or client"):
        RedisSampleRefQueue(store, url=redis_server.url, client=redis.Redis.from_url(redis_server.url))


def test_expired_leases_are_reclaimed_by_ordinary_calls_to_the_tail(
    make: Factory, store: LocalFeatureStore, clock: FakeClock
) -> None:
    queue = make(store)
    put(store, queue, 0)
    queue.acquire(timeout=0)
    put(store, queue, 1)
    clock.advance(9.0)
    assert queue.reclaim_expired() == 0
    clock.advance(1.0)  # deadline <= now: due
    put(store, queue, 2)  # any call reaps first: s0 goes to the tail before s2 is appended
    assert queue.stats().reclaimed == 1
    order = [queue.acquire(timeout=0) for _ in range(3)]
    assert [(lease.ref.sample_id, lease.redelivery_count) for lease in order] == [  # type: ignore[union-attr]
        ("s1", 0),
        ("s0", 1),
        ("s2", 0),
    ]
    clock.advance(10.0)
    assert queue.reclaim_expired() == 3 and queue.pending_count() == 3


def test_extend_pushes_the_deadline(make: Factory, store: LocalFeatureStore, clock: FakeClock) -> None:
    queue = make(store)
    put(store, queue, 0)
    lease = queue.acquire(timeout=0)
    assert lease is not None
    clock.advance(8.0)
    queue.extend(lease, 5.0)
    assert lease.deadline == clock() + 5.0
    clock.advance(4.0)
    assert queue.reclaim_expired() == 0
    queue.extend(lease)
    assert lease.deadline == clock() + 10.0 and queue.stats().extended == 2
    for bad in (0, -1, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="seconds"):
            queue.extend(lease, bad)  # type: ignore[arg-type]
    clock.advance(10.0)
    with pytest.raises(LeaseLost):
        queue.extend(lease)
    assert queue.stats().reclaimed == 1


def test_close_drains_then_returns_none_for_good(make: Factory, store: LocalFeatureStore) -> None:
    producer, consumer = make(store), make(store)
    put(store, producer, 0)
    put(store, producer, 1)
    lease = consumer.acquire(timeout=0)
    producer.close()
    assert consumer.is_closed and consumer.lifecycle_state == "draining"
    with pytest.raises(RuntimeError, match="queue is closed"):
        put(store, producer, 2)
    second = consumer.acquire(timeout=0)
    assert second is not None
    consumer.fail(second)  # redelivery still works while draining
    consumer.ack(consumer.acquire(timeout=0))  # type: ignore[arg-type]
    assert consumer.lifecycle_state == "draining" and consumer.acquire(timeout=0) is None
    consumer.ack(lease)  # type: ignore[arg-type]
    assert producer.lifecycle_state == "drained"
    started = time.monotonic()
    assert consumer.acquire(timeout=30) is None  # drained: returns at once, not after the timeout
    assert time.monotonic() - started < 30
    producer.close()  # idempotent
    assert producer.stats().put == 2


def test_blocked_acquire_wakes_on_a_put_from_another_instance(redis_server: Any, queue_name: str) -> None:
    """Server time (no injected clock): the waiter blocks in XREAD, not a sleep loop."""
    store = LocalFeatureStore()
    consumer = RedisSampleRefQueue(store, url=redis_server.url, name=queue_name)
    producer = RedisSampleRefQueue(store, url=redis_server.url, name=queue_name)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(consumer.acquire(timeout=60)))
    waiter.start()
    time.sleep(0.05)  # let it block (correctness does not depend on this)
    put(store, producer, 0)
    waiter.join(timeout=60)
    assert not waiter.is_alive() and got[0] is not None and got[0].ref.sample_id == "s0"
    # With the server's clock, Lease.deadline is in this process's monotonic time.
    assert time.monotonic() < got[0].deadline <= time.monotonic() + 30.0


def test_a_blocked_acquire_wakes_on_a_redelivery_under_an_injected_clock(
    make: Factory, store: LocalFeatureStore
) -> None:
    """A fail in another instance makes a sample pending again: it wakes the waiter, whose clock is a fake one
    (the wait is registered in server time all the same)."""
    holder, waiter_queue = make(store), make(store)
    put(store, holder, 0)
    lease = holder.acquire(timeout=0)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(waiter_queue.acquire(timeout=60)))
    started = time.monotonic()
    waiter.start()
    while not holder._redis.hget(holder._key["meta"], "waiting"):  # registered: it is (about to be) blocked
        time.sleep(0.01)
    holder.fail(lease)  # type: ignore[arg-type]
    waiter.join(timeout=60)
    assert got[0] is not None and got[0].ref.sample_id == "s0" and got[0].redelivery_count == 1
    assert time.monotonic() - started < 30


def test_puts_append_to_wake_only_while_a_consumer_waits(redis_server: Any, queue_name: str) -> None:
    """With nobody waiting, a put writes nothing to the wake stream (the cost a one-by-one loop would pay);
    an acquire that will block registers its wait, and puts wake it until that wait ends."""
    store = LocalFeatureStore()
    queue = RedisSampleRefQueue(store, url=redis_server.url, name=queue_name)
    wake = queue._key["wake"]
    put(store, queue, 0)
    queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    assert queue._redis.xlen(wake) == 0 and queue._redis.hget(queue._key["meta"], "waiting") is None
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(queue.acquire(timeout=0.5)))
    waiter.start()
    while not queue._redis.hget(queue._key["meta"], "waiting"):
        time.sleep(0.005)
    registered = time.monotonic()
    put(store, queue, 1)
    waiter.join(timeout=30)
    assert queue._redis.xlen(wake) == 1 and got[0] is not None and got[0].ref.sample_id == "s1"
    queue.ack(got[0])
    queue._redis.delete(wake)
    time.sleep(max(0.0, registered + 0.6 - time.monotonic()))  # the registered wait is over
    put(store, queue, 2)
    assert queue._redis.xlen(wake) == 0
    queue.disconnect()


def test_close_and_drain_wake_blocked_acquires(redis_server: Any, queue_name: str) -> None:
    store = LocalFeatureStore()
    owner = RedisSampleRefQueue(store, url=redis_server.url, name=queue_name)
    waiter_queue = RedisSampleRefQueue(store, url=redis_server.url, name=queue_name)
    put(store, owner, 0)
    lease = owner.acquire(timeout=0)
    results: list[Any] = []
    waiter = threading.Thread(target=lambda: results.append(waiter_queue.acquire(timeout=60)))
    waiter.start()
    owner.close()
    time.sleep(0.05)
    owner.ack(lease)  # type: ignore[arg-type]  # drains: the waiter must return None at once
    waiter.join(timeout=60)
    assert not waiter.is_alive() and results == [None] and waiter_queue.lifecycle_state == "drained"


def test_blocked_acquire_wakes_at_a_lease_deadline_to_reap(redis_server: Any, queue_name: str) -> None:
    store = LocalFeatureStore()
    queue = RedisSampleRefQueue(store, VT(0.2), url=redis_server.url, name=queue_name)
    put(store, queue, 0)
    crashed = queue.acquire(timeout=0)
    again = queue.acquire(timeout=60)
    assert again is not None and crashed is not None
    assert (again.ref.sample_id, again.redelivery_count) == ("s0", 1)


def test_backpressure_pauses_and_resumes_with_hysteresis(make: Factory, store: LocalFeatureStore) -> None:
    events: list[tuple[str, int]] = []

    def on_pause(health: StoreHealth) -> None:
        events.append(("pause", health.resident_bytes))

    def on_resume(health: StoreHealth) -> None:
        events.append(("resume", health.resident_bytes))

    nbytes = [sum(t.numel() * t.element_size() for t in sample_tensors(i).values()) for i in range(3)]
    # All three resident: pause; only s2 (the largest) left: resume.
    producer = make(store, high_watermark_bytes=sum(nbytes), low_watermark_bytes=nbytes[2],
                    on_pause=on_pause, on_resume=on_resume)  # fmt: skip
    consumer = make(store)
    for i in range(2):
        producer.put_blocks_until_below(store.put(f"s{i}", sample_tensors(i)))
    assert producer.backpressure_state == "flowing"
    last = store.put("s2", sample_tensors(2))  # resident now reaches the high watermark
    done, stop = threading.Event(), threading.Event()

    def produce() -> None:
        producer.put_blocks_until_below(last, poll_interval=0.01, abort_when=stop.is_set)
        done.set()

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        assert not done.wait(0.2) and producer.backpressure_state == "paused"
        consumer.ack(consumer.acquire(timeout=0))  # type: ignore[arg-type]  # s1 + s2 resident > low: still paused
        assert not done.wait(0.2)
        consumer.ack(consumer.acquire(timeout=0))  # type: ignore[arg-type]  # s2 alone <= low: resume
        assert done.wait(30)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert [kind for kind, _ in events] == ["pause", "resume"] and events[1][1] <= nbytes[2]
    assert producer.stats().producer_pauses == 1 and producer.pending_count() == 1


def test_blocked_put_aborts_and_refuses_once_closed(make: Factory, store: LocalFeatureStore) -> None:
    queue = make(store, high_watermark_bytes=1, low_watermark_bytes=0)
    put(store, queue, 0)
    ref = store.put("s1", sample_tensors(1))
    with pytest.raises(RuntimeError, match="aborted"):
        queue.put_blocks_until_below(ref, poll_interval=0.001, abort_when=lambda: queue.backpressure_state == "paused")
    queue.close()
    with pytest.raises(RuntimeError, match="queue is closed"):
        queue.put_blocks_until_below(ref, poll_interval=0.001)


Trace = list[tuple[str, dict[str, object]]]


def _traced_lifecycle(make: Callable[..., LeaseQueue], store: LocalFeatureStore, clock: FakeClock) -> Trace:
    """Extend, reclaim, a stale ack, a fail into the dead letters, then batches, a close and the drain, on the
    queue ``make(store, max_deliveries=2, tracer=...)`` (visibility timeout 10 s); return its trace with lease
    ids numbered by first appearance."""
    recorder = TraceRecorder()
    queue = make(store, max_deliveries=2, tracer=recorder)
    queue.put(store.put("s0", sample_tensors(0)))
    lease = queue.acquire(timeout=0)
    queue.extend(lease, 1.0)  # type: ignore[arg-type]
    clock.advance(1.0)
    queue.reclaim_expired()
    again = queue.acquire(timeout=0)
    queue.ack(lease)  # type: ignore[arg-type]
    queue.fail(again)  # type: ignore[arg-type]
    clock.advance(0.5)
    queue.put_many([store.put(f"s{i}", sample_tensors(i)) for i in (1, 2, 3)])
    batch = queue.acquire_many(3, timeout=0)
    queue.ack_many(batch[:2])
    queue.fail_many(batch[2:])
    queue.close()
    queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    trace = recorder.events
    renamed: dict[object, int] = {}
    for _, fields in trace:
        if fields.get("lease_id") is not None:
            fields["lease_id"] = renamed.setdefault(fields["lease_id"], len(renamed) + 1)
    return trace


def test_tracer_sees_the_spec_actions_in_order_with_the_state_each_left(
    make: Factory, store: LocalFeatureStore, clock: FakeClock
) -> None:
    trace = _traced_lifecycle(make, store, clock)

    def state(pending: int, outstanding: int, now: float, **fields: object) -> dict[str, object]:
        return {**fields, "pending": pending, "outstanding": outstanding, "now": now}

    assert trace == [
        ("Put", state(1, 0, 1000.0, sample_id="s0", n=0)),
        ("Acquire", state(0, 1, 1000.0, sample_id="s0", lease_id=1, n=0, deadline=1010.0)),
        ("Extend", state(0, 1, 1000.0, sample_id="s0", lease_id=1, n=0, deadline=1001.0)),
        ("Reclaim", state(1, 0, 1001.0, sample_id="s0", lease_id=1, n=0, deadline=1001.0)),
        ("Acquire", state(0, 1, 1001.0, sample_id="s0", lease_id=2, n=1, deadline=1011.0)),
        ("StaleRejected", state(0, 1, 1001.0, op="ack", lease_id=1, forged=False)),
        ("Fail", state(0, 0, 1001.0, sample_id="s0", lease_id=2, n=1)),
        ("DeadLetter", state(0, 0, 1001.0, sample_id="s0", n=1, kept=False)),
        # a batch call's events: each reports the state its item left
        *(("Put", state(k, 0, 1001.5, sample_id=f"s{k}", n=0)) for k in (1, 2, 3)),
        *(
            ("Acquire", state(3 - k, k, 1001.5, sample_id=f"s{k}", lease_id=k + 2, n=0, deadline=1011.5))
            for k in (1, 2, 3)
        ),
        *(("Ack", state(0, 3 - k, 1001.5, sample_id=f"s{k}", lease_id=k + 2, n=0)) for k in (1, 2)),
        ("Fail", state(1, 0, 1001.5, sample_id="s3", lease_id=5, n=0)),
        ("Close", state(1, 0, 1001.5)),
        ("Acquire", state(0, 1, 1001.5, sample_id="s3", lease_id=6, n=1, deadline=1011.5)),
        ("Ack", state(0, 0, 1001.5, sample_id="s3", lease_id=6, n=1)),
        ("Drain", state(0, 0, 1001.5)),
    ]


def test_traced_events_carry_the_in_process_queues_fields_and_values(
    make: Factory, store: LocalFeatureStore, clock: FakeClock
) -> None:
    redis_trace = _traced_lifecycle(make, store, clock)
    local_clock = FakeClock(1000.0)
    local_trace = _traced_lifecycle(
        lambda local_store, **hooks: SampleRefQueue(local_store, VT(10.0), clock=local_clock, **hooks),
        LocalFeatureStore(max_samples=64),
        local_clock,
    )
    # The one difference: the in-process queue also names a stale lease's sample and redelivery count, read from
    # the lease object presented; the Redis server identifies it by its lease id alone.
    for action, fields in local_trace:
        if action == "StaleRejected":
            del fields["sample_id"], fields["n"]
    assert redis_trace == local_trace


def test_reaper_thread_reclaims_for_a_queue_nobody_polls(redis_server: Any, queue_name: str) -> None:
    store = LocalFeatureStore()
    reaped = threading.Event()
    queue = RedisSampleRefQueue(
        store, VT(0.05), url=redis_server.url, name=queue_name, reaper_interval=0.02,
        max_deliveries=1, on_dead_letter=lambda _: reaped.set(),
    )  # fmt: skip
    put(store, queue, 0)
    queue.acquire(timeout=0)
    assert reaped.wait(30) and not store.is_resident("s0")
    queue.disconnect()


def test_settled_samples_leave_nothing_behind_in_redis(
    make: Factory, store: LocalFeatureStore, redis_client: Any, queue_name: str
) -> None:
    queue = make(store, max_deliveries=1, dedup_window=1)
    for i in range(5):
        put(store, queue, i)
    for i in range(5):
        lease = queue.acquire(timeout=0)
        (queue.ack if i % 2 else queue.fail)(lease)  # type: ignore[arg-type, operator]
    prefix = f"featurestream:{{{queue_name}}}:"
    assert redis_client.llen(prefix + "pending") == 0
    for key in ("refs", "leases"):
        assert redis_client.hlen(prefix + key) == 0
    assert redis_client.zcard(prefix + "deadlines") == 0
    assert redis_client.hlen(prefix + "done") == redis_client.llen(prefix + "done_order") == 1  # the window


def test_lost_replies_are_retried_idempotently(make: Factory, store: LocalFeatureStore) -> None:
    """A script that ran but whose reply was lost (server crash) is safe to run again with the same tokens."""
    queue = make(store)
    ref = put(store, queue, 0)
    from featurestream.backends.redis.wire import ref_to_json

    status, *_ = queue._engine._run("put", "s1", ref_to_json(store.put("s1", sample_tensors(1))), "tok", "")
    assert status == b"ok"
    status, *_ = queue._engine._run("put", "s1", "ignored", "tok", "")
    assert status == b"ok" and queue.stats().put == 2
    lease = queue.acquire(timeout=0)
    assert lease is not None and lease.ref == ref
    args = (f"{lease.lease_id:016d}", lease.token, "s0")
    assert queue._engine._run("ack", *args)[0] == [b"ok"]
    assert queue._engine._run("ack", *args)[0] == [b"again"]  # the client then scrubs; no stale count, no second ack
    assert queue.stats().acked == 1 and queue.stats().stale_rejected == 0


def test_survives_a_redis_crash_and_restart(durable_redis: Any, queue_name: str) -> None:
    """AOF with appendfsync always: leases, pending entries and counters survive SIGKILL + restart."""
    store = LocalFeatureStore()
    queue = RedisSampleRefQueue(store, url=durable_redis.url, name=queue_name)
    for i in range(3):
        put(store, queue, i)
    lease = queue.acquire(timeout=0)
    durable_redis.restart(kill=True)
    queue.ack(lease)  # type: ignore[arg-type]  # reconnects transparently, the lease is still live
    rest = [queue.acquire(timeout=0) for _ in range(2)]
    assert [lease.ref.sample_id for lease in rest] == ["s1", "s2"]  # type: ignore[union-attr]
    for lease in rest:
        queue.ack(lease)  # type: ignore[arg-type]
    stats = queue.stats()
    assert (stats.put, stats.acked, stats.pending, stats.outstanding) == (3, 3, 0, 0)
    assert store.health().sample_count == 0
    queue.disconnect()


def test_is_a_lease_queue(make: Factory, store: LocalFeatureStore) -> None:
    queue = make(store)
    assert isinstance(queue, LeaseQueue) and not isinstance(queue, SampleRefQueue) and queue.store is store


def test_the_producing_instance_forgets_samples_settled_elsewhere(make: Factory, tmp_path: Path) -> None:
    """Each process has its own store instance: the producer's residency must fall when a consumer acks."""
    producer_store, consumer_store = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
    producer, consumer = make(producer_store), make(consumer_store)
    for i in range(3):
        put(producer_store, producer, i)
    consumer.ack(consumer.acquire(timeout=0))  # type: ignore[arg-type]
    consumer.fail(consumer.acquire(timeout=0))  # type: ignore[arg-type]
    assert producer_store.health().sample_count == 3  # nothing told it yet
    producer.reclaim_expired()  # any call of the producer reads the settle feed
    assert producer_store.health().sample_count == 2
    assert not producer_store.is_resident("s0") and producer_store.is_resident("s1")
    assert producer_store.is_resident("s2")


def test_a_late_fail_of_a_lease_reaped_into_the_dead_letters_is_stale(
    make: Factory, store: LocalFeatureStore, clock: FakeClock
) -> None:
    queue = make(store, max_deliveries=1)
    put(store, queue, 0)
    lease = queue.acquire(timeout=0)
    clock.advance(10.0)
    queue.fail(lease)  # type: ignore[arg-type]  # reaps first: dead-lettered as expired, then this fail is stale
    stats = queue.stats()
    assert (stats.reclaimed, stats.dead_lettered, stats.failed, stats.stale_rejected) == (1, 1, 0, 1)
    assert queue.dead_letters()[0].reason == "expired 1 times (max_deliveries=1)"


def test_a_refused_put_leaves_the_store_as_it_was(make: Factory, store: LocalFeatureStore) -> None:
    queue = make(store)
    first = put(store, queue, 0)
    queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    retry = store.put(first.sample_id, sample_tensors(0))  # a producer's retry of a settled id
    with pytest.raises(ValueError, match="already acked"):
        queue.put(retry)
    late = store.put("late", sample_tensors(1))
    queue.close()
    with pytest.raises(RuntimeError, match="closed"):
        queue.put(late)
    for ref in (retry, late):  # neither is retained: plain residency frees each on its last release
        store.release(store.get(ref)[1])
        assert not store.is_resident(ref.sample_id)


def test_a_put_refused_after_close_keeps_a_queued_sample_retained(make: Factory, store: LocalFeatureStore) -> None:
    queue = make(store)
    queued = put(store, queue, 0)
    queue.close()
    with pytest.raises(RuntimeError, match="closed"):
        queue.put(queued)  # a retry of a sample the queue still holds
    store.release(store.get(queued)[1])
    assert store.is_resident(queued.sample_id), "the pending sample must survive its handles"


def test_put_blocks_at_the_stores_sample_count_cap(make: Factory) -> None:
    """Bytes far below every watermark, but the store at ``max_samples``: the producer waits instead of its next
    ``store.put`` raising ``MemoryError``, and goes on once a consumer (another instance) acked a sample."""
    store = LocalFeatureStore(max_samples=2)
    paused = threading.Event()
    producer = make(store, on_pause=lambda health: paused.set())
    consumer = make(store)
    producer.put_blocks_until_below(store.put("s0", sample_tensors(0)))
    second = store.put("s1", sample_tensors(1))  # the store is now at its cap
    thread = threading.Thread(target=producer.put_blocks_until_below, args=(second, 0.01), daemon=True)
    thread.start()
    assert paused.wait(30) and producer.backpressure_state == "paused"
    assert producer.pending_count() == 1  # s1 waits, unqueued
    consumer.ack(consumer.acquire(timeout=5))  # type: ignore[arg-type]
    thread.join(timeout=30)
    assert not thread.is_alive() and producer.pending_count() == 1
    store.put("s2", sample_tensors(2))  # room again: the cap was never hit
    assert producer.stats().producer_pauses == 1


def test_put_refuses_a_ref_whose_bytes_are_gone_and_changes_nothing(make: Factory, store: LocalFeatureStore) -> None:
    queue = make(store)
    gone = store.put("gone", sample_tensors(0))
    store.release(store.get(gone)[1])  # no queue held it: its last handle freed it
    fine = store.put("fine", sample_tensors(1))
    before = queue.stats()
    for call in (queue.put, lambda ref: queue.put_many([fine, ref]), queue.put_blocks_until_below):
        with pytest.raises(ValueError, match="sample 'gone' is not resident in mem://local-"):
            call(gone)
    assert queue.stats() == before and queue.pending_count() == 0
    queue.put(fine)
    assert queue.pending_count() == 1


def test_put_refuses_a_ref_subclass_carrying_a_tensor(make: Factory, store: LocalFeatureStore) -> None:
    queue = make(store)
    ref = store.put("s0", sample_tensors(0))

    class Carrying(type(ref)):  # type: ignore[misc]
        pass

    carrying = Carrying(**{f.name: getattr(ref, f.name) for f in dataclasses.fields(ref)})
    object.__setattr__(carrying, "cached", sample_tensors(0)["input_ids"])
    with pytest.raises(TypeError, match=r"ref\.cached holds a Tensor"):
        queue.put(carrying)
    assert queue.pending_count() == 0 and queue.stats().put == 0


def test_a_first_connection_to_a_closed_port_fails_fast_naming_url_queue_and_timeout(
    closed_port_url: str, store: LocalFeatureStore, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING"), pytest.raises(RedisUnreachable) as caught:
        RedisSampleRefQueue(store, url=closed_port_url, name="run-7", reconnect_timeout=45.0)
    message = str(caught.value)
    assert message.startswith(f"cannot reach Redis at {closed_port_url} for queue 'run-7': ")
    assert "Connection refused" in message and f"tried for {FIRST_CONTACT_TIMEOUT:g} s" in message
    assert "reconnect_timeout=45 s" in message
    assert isinstance(caught.value, redis.ConnectionError)  # what callers catching redis-py's error expect
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]  # no retry chatter before giving up
    with pytest.raises(RedisUnreachable, match="for queue 'run-7'"):
        RedisSampleRefQueue.open(closed_port_url, "run-7")


def test_a_server_that_is_not_redis_is_reported_as_such(not_redis_url: str, store: LocalFeatureStore) -> None:
    for open_it in (
        lambda: RedisSampleRefQueue(store, url=not_redis_url, name="run-7"),
        lambda: RedisSampleRefQueue.open(not_redis_url, "run-7"),
    ):
        with pytest.raises(
            NotRedisServer, match=f"Redis at {not_redis_url} for queue 'run-7': the server there is not"
        ):
            open_it()


def test_the_queue_pins_its_store_and_refuses_an_instance_of_another(
    make: Factory, store: LocalFeatureStore, redis_server: Any, queue_name: str, tmp_path: Path
) -> None:
    first = make(store)
    make(store)  # the same store (another thread's instance): fine
    other = LocalFeatureStore(max_samples=64)
    with pytest.raises(errors.StoreMismatch) as caught:
        make(other)
    assert str(caught.value) == (
        f"queue {queue_name!r} is bound to the store {store.store_uri} (pinned by its first instance), but this "
        f"instance's store is {other.store_uri}: every instance of a queue must use the same store (or use another "
        "queue name)"
    )
    operator = RedisSampleRefQueue.open(redis_server.url, queue_name)  # no store: pins and checks nothing
    operator.disconnect()
    put(store, first, 0)
    assert first.pending_count() == 1  # the refused instance changed nothing
    shared = [SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)]  # two processes' instances
    with pytest.raises(errors.StoreMismatch):
        make(shared[0])
    assert len({s.store_uri for s in shared}) == 1
