"""Dead-letter repair and operator handles on the Redis backend: requeue, purge, kept bytes, status reads."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from featurestream import LocalFeatureStore, SampleRefQueue, SharedDirFeatureStore
from featurestream import VisibilityTimeout as VT
from featurestream.common.refs import SampleRef
from featurestream.core import events
from featurestream.testing import sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402

Factory = Callable[..., RedisSampleRefQueue]


@pytest.fixture
def queue_defaults() -> dict[str, Any]:
    """One delivery each: a single fail dead-letters a sample."""
    return {"visibility_timeout": VT(10.0), "max_deliveries": 1}


def kill(queue: RedisSampleRefQueue, store: LocalFeatureStore, *indices: int) -> list[SampleRef]:
    """Put the samples and fail each once (max_deliveries=1): dead letters, oldest first."""
    refs = [store.put(f"s{i}", sample_tensors(i)) for i in indices]
    queue.put_many(refs)
    queue.fail_many(queue.acquire_many(len(refs), timeout=0))
    return refs


def test_without_kept_bytes_requeue_is_refused_and_purge_drops(make: Factory, store: LocalFeatureStore) -> None:
    queue = make(store)
    kill(queue, store, 0, 1)
    assert not store.is_resident("s0")  # scrubbed when it died
    with pytest.raises(ValueError, match="'s0' cannot be requeued: its bytes were not kept"):
        queue.requeue_dead_letters(["s0"])
    with pytest.raises(LookupError, match="'nope' is not a dead letter"):
        queue.purge_dead_letters(["s1", "nope"])
    assert [d.ref.sample_id for d in queue.dead_letters()] == ["s0", "s1"]  # refused as a whole
    assert queue.purge_dead_letters(["s1"]) == ["s1"]
    assert queue.purge_dead_letters() == ["s0"] and queue.dead_letters() == []
    with pytest.raises(ValueError, match="empty"):
        queue.purge_dead_letters([])
    with pytest.raises(TypeError, match="single str"):
        queue.purge_dead_letters("s0")


def test_dead_letters_reads_only_the_newest_asked_for(
    make: Factory, store: LocalFeatureStore, redis_client: Any, queue_name: str
) -> None:
    queue = make(store)
    kill(queue, store, 0, 1, 2)

    def ids(letters: list[Any]) -> list[str]:
        return [letter.ref.sample_id for letter in letters]

    assert ids(queue.dead_letters(newest=2)) == ["s1", "s2"]  # oldest first, as dead_letters() lists them
    assert ids(queue.dead_letters(newest=5)) == ids(queue.dead_letters()) == ["s0", "s1", "s2"]
    assert queue.dead_letters(newest=0) == []
    # The older letters are not even read: one that would not decode goes unnoticed.
    redis_client.lset(f"featurestream:{{{queue_name}}}:dead", 0, b"not a dead letter")
    assert ids(queue.dead_letters(newest=2)) == ["s1", "s2"]
    with pytest.raises(ValueError):
        queue.dead_letters()
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match=f"newest must be an int >= 0, got {bad!r}"):
            queue.dead_letters(newest=bad)  # type: ignore[arg-type]


def test_kept_bytes_are_retained_up_to_the_cap_and_requeue_delivers_again(
    make: Factory, store: LocalFeatureStore
) -> None:
    probe = store.put("probe", sample_tensors(0))
    size = probe.estimated_bytes
    store.scrub(probe)
    trace: list[tuple[str, dict[str, object]]] = []
    queue = make(store, keep_dead_letter_bytes=size, tracer=lambda action, fields: trace.append((action, fields)))
    kill(queue, store, 0, 1)  # the cap holds one sample: s0's bytes are kept, s1's are not
    assert store.is_resident("s0") and not store.is_resident("s1")
    with pytest.raises(ValueError, match="'s1' cannot be requeued"):
        queue.requeue_dead_letters()  # all or nothing: s0 is not requeued either
    assert len(queue.dead_letters()) == 2
    assert queue.requeue_dead_letters(["s0"]) == ["s0"]
    assert [d.ref.sample_id for d in queue.dead_letters()] == ["s1"] and queue.pending_count() == 1
    lease = queue.acquire(timeout=0)
    assert lease is not None and (lease.ref.sample_id, lease.redelivery_count) == ("s0", 0)  # a fresh budget
    queue.ack(lease)
    assert not store.is_resident("s0") and queue.stats().acked == 1
    with pytest.raises(ValueError, match="already acked"):
        queue.put(store.put("s0", sample_tensors(0)))  # acked: exactly once holds for the requeued id
    # Traced with the state each left (the server's clock: now not compared): s0 kept, s1 scrubbed; the requeue
    # puts s0 back with a fresh budget (n 0) into an otherwise empty queue.
    untimed = [(action, {k: v for k, v in f.items() if k != "now"}) for action, f in trace]
    assert [(f["sample_id"], f["kept"]) for action, f in untimed if action == "DeadLetter"] == [
        ("s0", True),
        ("s1", False),
    ]
    assert (events.REQUEUE_DEAD_LETTER, {"sample_id": "s0", "n": 0, "pending": 1, "outstanding": 0}) in untimed


def test_purge_releases_kept_bytes(make: Factory, redis_server: Any, queue_name: str, tmp_path: Path) -> None:
    # two processes' instances of one shared store: the same URI, each its own residency
    producer_store, consumer_store = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
    producer = make(producer_store, keep_dead_letter_bytes=10**9)
    kill(producer, producer_store, 0, 1)
    assert producer_store.health().sample_count == 2  # both kept
    operator = RedisSampleRefQueue.open(redis_server.url, queue_name)
    try:
        assert operator.keep_dead_letter_bytes == 10**9 and operator.max_deliveries == 1
        assert operator.purge_dead_letters(["s1"]) == ["s1"]
    finally:
        operator.disconnect()
    producer.reclaim_expired()  # the producer's next call reads the settle feed and scrubs what was purged
    assert producer_store.is_resident("s0") and not producer_store.is_resident("s1")
    trace: list[tuple[str, dict[str, object]]] = []
    other = make(consumer_store, keep_dead_letter_bytes=10**9, tracer=lambda a, f: trace.append((a, f)))
    assert other.purge_dead_letters() == ["s0"]
    assert [(action, f["sample_id"], f["pending"], f["outstanding"]) for action, f in trace] == [
        (events.PURGE_DEAD_LETTER, "s0", 0, 0)
    ]
    producer.reclaim_expired()
    assert producer_store.health().sample_count == 0


def test_an_operator_handle_reads_status_and_never_produces(
    make: Factory, store: LocalFeatureStore, redis_server: Any, queue_name: str
) -> None:
    with pytest.raises(LookupError, match="no queue named 'missing'"):
        RedisSampleRefQueue.open(redis_server.url, "missing")
    queue = make(store)
    assert queue.oldest_lease_age() is None
    queue.put_many([store.put(f"s{i}", sample_tensors(i)) for i in range(2)])
    lease = queue.acquire(timeout=0)
    operator = RedisSampleRefQueue.open(redis_server.url, queue_name)
    try:
        age = operator.oldest_lease_age()
        assert age is not None and age >= 0
        assert (operator.stats().pending, operator.stats().outstanding) == (1, 1)
        with pytest.raises(RuntimeError, match="operator's handle"):
            operator.put(store.put("s9", sample_tensors(9)))
        with pytest.raises(RuntimeError, match="operator's handle"):
            operator.acquire(timeout=0)
        assert operator.stats().put == 2
    finally:
        operator.disconnect()
    queue.ack(lease)  # type: ignore[arg-type]
    assert queue.oldest_lease_age() is None


def test_oldest_lease_age_is_the_oldest_live_lease_by_the_server_clock(redis_server: Any, queue_name: str) -> None:
    store = LocalFeatureStore()
    queue = RedisSampleRefQueue(store, url=redis_server.url, name=queue_name)
    queue.put_many([store.put(f"s{i}", sample_tensors(i)) for i in range(2)])
    first = queue.acquire(timeout=0)
    time.sleep(0.3)
    second = queue.acquire(timeout=0)
    older = queue.oldest_lease_age()
    assert older is not None and 0.3 <= older < 30
    queue.ack(first)  # type: ignore[arg-type]
    younger = queue.oldest_lease_age()
    assert younger is not None and younger < older - 0.2
    queue.ack(second)  # type: ignore[arg-type]
    assert queue.oldest_lease_age() is None
    queue.disconnect()


def test_settings_include_kept_bytes(make: Factory, store: LocalFeatureStore) -> None:
    make(store, keep_dead_letter_bytes=100)
    with pytest.raises(ValueError, match=r"keep_dead_letter_bytes=100; this instance asks for .*=0"):
        make(store)


@pytest.mark.parametrize("batched", [False, True], ids=["put", "put_many"])
def test_a_kept_dead_letter_the_dedup_window_forgot_is_not_re_put(
    make: Factory, store: LocalFeatureStore, batched: bool
) -> None:
    # Found by the spec's keep model: a re-put accepted here let a later purge scrub a pending sample's bytes.
    queue = make(store, dedup_window=1, keep_dead_letter_bytes=1 << 30)
    (ref,) = kill(queue, store, 0)
    queue.put(store.put("b", sample_tensors(1)))
    queue.ack(queue.acquire(timeout=0))  # the window of one now remembers only b
    with pytest.raises(ValueError, match="'s0' is a dead letter whose bytes are kept"):
        queue.put_many([ref]) if batched else queue.put(ref)
    assert store.is_resident("s0") and queue.pending_count() == 0  # the refused put left the kept retain alone
    assert queue.purge_dead_letters(["s0"]) == ["s0"]
    assert not store.is_resident("s0") and queue.acquire(timeout=0) is None


@pytest.mark.parametrize("backend", ["in-process", "redis"])
def test_a_requeued_id_settled_again_is_remembered_a_full_window_from_its_latest_settle(
    make: Factory, store: LocalFeatureStore, backend: str
) -> None:
    # The one way an id is settled again while the window still holds it: a requeued kept dead letter. Its old
    # record must go at the requeue, else the window evicts the id at its first settle's position (and Redis's
    # done_order, holding the id twice, would drop the newer record when the older entry leaves).
    settings: dict[str, Any] = {"max_deliveries": 1, "dedup_window": 2, "keep_dead_letter_bytes": 1 << 30}
    queue: Any = SampleRefQueue(store, VT(10.0), **settings) if backend == "in-process" else make(store, **settings)

    def settle(sample_id: str, index: int) -> None:
        queue.put(store.put(sample_id, sample_tensors(index)))
        queue.ack(queue.acquire(timeout=0))

    kill(queue, store, 0)  # window [s0]
    settle("b", 1)  # [s0, b]
    assert queue.requeue_dead_letters(["s0"]) == ["s0"]  # [b]
    queue.ack(queue.acquire(timeout=0))  # [b, s0]
    settle("c", 2)  # [s0, c]
    with pytest.raises(ValueError, match="'s0' was already acked"):
        queue.put(store.put("s0", sample_tensors(0)))
    queue.put(store.put("b", sample_tensors(1)))  # b left the window: a new incarnation
    assert queue.stats().dedup_refused == 1
