"""Both backends refuse the same misuse with the same typed error and the same message (``core.errors``)."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from featurestream import LocalFeatureStore, SampleRefQueue
from featurestream import VisibilityTimeout as VT
from featurestream.common import errors
from featurestream.core.protocol import LeaseQueue
from featurestream.testing import FakeClock, sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py

Factory = Callable[..., LeaseQueue]


@pytest.fixture(params=["memory", "redis"])
def make(request: pytest.FixtureRequest, queue_name: str) -> Iterator[Factory]:
    made: list[RedisSampleRefQueue] = []

    def factory(store: LocalFeatureStore, **kwargs: Any) -> LeaseQueue:
        kwargs.setdefault("visibility_timeout", VT(10.0))
        kwargs.setdefault("clock", FakeClock(1000.0))
        if request.param == "memory":
            return SampleRefQueue(store, **kwargs)
        server = request.getfixturevalue("redis_server")
        queue = RedisSampleRefQueue(store, url=server.url, name=queue_name, **kwargs)
        made.append(queue)
        return queue

    yield factory
    for queue in made:
        queue.disconnect()


def refused(call: Callable[[], object], kind: type[Exception]) -> Exception:
    with pytest.raises(kind) as caught:
        call()
    error = caught.value
    assert type(error) is kind, f"{type(error).__name__} raised, {kind.__name__} expected"
    copy = pickle.loads(pickle.dumps(error))  # crosses process boundaries as what was raised
    assert type(copy) is kind and str(copy) == str(error) and vars(copy) == vars(error)
    return error


def test_put_refusals_are_typed_with_one_message(make: Factory) -> None:
    store = LocalFeatureStore(max_samples=64)
    queue = make(store)
    refs = [store.put(f"s{i}", sample_tensors(i)) for i in range(3)]
    queue.put(refs[0])
    duplicate = refused(lambda: queue.put(refs[0]), errors.DuplicateSample)
    assert "'s0' is already present: it is already queued" in str(duplicate)
    repeated = refused(lambda: queue.put_many([refs[1], refs[1]]), errors.RepeatedInBatch)
    assert str(repeated) == "sample 's1' appears twice in one put_many; ids must be unique"
    lease = queue.acquire(timeout=0)
    assert lease is not None
    queue.ack(lease)
    settled = refused(lambda: queue.put(refs[0]), errors.SettledSample)
    assert settled.outcome == "acked" and str(settled).startswith("sample 's0' was already acked; re-puts")
    lost = refused(lambda: queue.extend(lease), errors.LeaseLost)
    assert str(lost) == (
        f"lease {lease.lease_id!r} of sample 's0' is not live; stop working on it (it was settled or reclaimed)"
    )
    aborted = refused(lambda: queue.put_blocks_until_below(refs[2], abort_when=lambda: True), errors.PutAborted)
    assert str(aborted) == "put of sample 's2' aborted: abort_when() returned True"
    queue.close()
    closed = refused(lambda: queue.put(refs[2]), errors.QueueClosed)
    assert isinstance(closed, RuntimeError) and str(closed) == "cannot put sample 's2': the queue is closed"
    refused(lambda: queue.put_blocks_until_below(refs[2]), errors.QueueClosed)


def test_dead_letter_repair_refusals_are_typed(make: Factory) -> None:
    store = LocalFeatureStore(max_samples=64)
    queue = make(store, max_deliveries=1)
    ref = store.put("s0", sample_tensors(0))
    queue.put(ref)
    lease = queue.acquire(timeout=0)
    assert lease is not None
    queue.fail(lease)  # dead, and its bytes scrubbed: keep_dead_letter_bytes is 0
    unknown = refused(lambda: queue.requeue_dead_letters(["nope"]), errors.NotDeadLetter)
    assert str(unknown).startswith("sample 'nope' is not a dead letter of ") and "nothing requeued" in str(unknown)
    refused(lambda: queue.purge_dead_letters(["nope"]), errors.NotDeadLetter)
    gone = refused(lambda: queue.requeue_dead_letters(["s0"]), errors.DeadLetterNotKept)
    assert "'s0' cannot be requeued: its bytes were not kept (keep_dead_letter_bytes=0" in str(gone)
    assert queue.purge_dead_letters(["s0"]) == ["s0"]


def test_put_of_a_kept_dead_letter_is_typed(make: Factory) -> None:
    store = LocalFeatureStore(max_samples=64)
    queue = make(store, max_deliveries=1, dedup_window=0, keep_dead_letter_bytes=1 << 20)
    ref = store.put("s0", sample_tensors(0))
    queue.put(ref)
    lease = queue.acquire(timeout=0)
    assert lease is not None
    queue.fail(lease)  # max_deliveries=1: dead, its bytes kept
    kept = refused(lambda: queue.put(ref), errors.KeptDeadLetter)
    assert "'s0' is a dead letter whose bytes are kept" in str(kept)


def test_edge_refusals_are_typed_with_one_message(make: Factory) -> None:
    store = LocalFeatureStore(max_samples=64)
    queue = make(store)
    gone = store.put("gone", sample_tensors(0))
    store.release(store.get(gone)[1])  # no queue held it: freed
    missing = refused(lambda: queue.put(gone), errors.NotResident)
    assert str(missing).startswith(f"sample 'gone' is not resident in {store.store_uri}: its bytes were released")
    for action, call in (("ack", queue.ack), ("fail", queue.fail), ("extend", queue.extend)):
        bad = refused(lambda call=call: call("not a lease"), errors.NotALease)  # type: ignore[misc]
        assert str(bad) == f"{action} expects a Lease returned by acquire, got str: 'not a lease'"
    refused(lambda: queue.ack_many([None]), errors.NotALease)  # type: ignore[list-item]
    ref = store.put("s0", sample_tensors(0))
    carrying = type("Carrying", (type(ref),), {})(**{name: getattr(ref, name) for name in vars(ref)})
    object.__setattr__(carrying, "cache", sample_tensors(0)["input_ids"])
    tensor = refused(lambda: queue.put(carrying), errors.TensorInRef)
    assert str(tensor).startswith("sample 's0' cannot travel as a ref: ref.cache holds a Tensor")
    assert queue.pending_count() == 0
