"""The library's stateful suite (``featurestream.testing``) against the Redis backend on a real server.

The Redis backend declares that its replies can be lost (``featurestream.testing.redis_faults.RedisLostReplies``,
through ``replies=``): the machine's ``lose_reply`` rule then makes a call run on the server while its reply is
lost, and the client retries it.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Callable, Collection, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from featurestream import LocalFeatureStore
from featurestream.core.lease import Lease
from featurestream.testing import EXACT_CALLS, InvariantViolation, MachineConfig, make_queue_machine

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py
from featurestream.testing.redis_faults import RedisLostReplies  # noqa: E402 - needs redis-py


@pytest.fixture(scope="module")
def shared_client(redis_server: Any) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def queues_on(client: redis.Redis, prefix: str) -> Callable[..., RedisSampleRefQueue]:
    def queue_factory(store: LocalFeatureStore, **hooks: Any) -> RedisSampleRefQueue:
        return RedisSampleRefQueue(store, client=client, name=f"{prefix}-{uuid.uuid4().hex}", **hooks)

    return queue_factory


def counted(made: list[RedisLostReplies], always: Collection[str] = ()) -> Callable[..., RedisLostReplies]:
    """``replies=`` for the machine that keeps each example's ``RedisLostReplies`` in ``made``."""

    def replies(queue: RedisSampleRefQueue) -> RedisLostReplies:
        made.append(RedisLostReplies(queue, always))
        return made[-1]

    return replies


def test_redis_queue_follows_the_spec(shared_client: redis.Redis) -> None:
    """Every rule of the spec machine, lost replies among them, applied to RedisSampleRefQueue (a fresh queue
    name per example); a tenth of its runs lose a reply at least."""
    made: list[RedisLostReplies] = []
    machine = make_queue_machine(
        lambda: LocalFeatureStore(max_samples=16),
        queues_on(shared_client, "stateful"),
        name="RedisQueueMachine",
        replies=counted(made),
    )
    run_state_machine_as_test(machine)
    losing = sum(1 for replies in made if replies.lost())
    assert losing > len(made) // 10, f"{losing} of {len(made)} examples lost a reply"


def test_redis_queue_rejects_what_the_consumers_schema_refuses(shared_client: redis.Redis) -> None:
    """The machine with s3 untrainable: consumers reject it (the Redis reject function) and never ack it; the
    queue must dead-letter it at once, reason schema, whatever deliveries are left, counted failed, never acked,
    lost replies and the spec mirror included."""
    rejected: list[str] = []
    make_queue = queues_on(shared_client, "rejecting")

    def queue_factory(store: LocalFeatureStore, **hooks: Any) -> RedisSampleRefQueue:
        queue = make_queue(store, **hooks)
        reject = queue.reject

        def counted_reject(lease: Lease, why: str) -> bool:
            taken = reject(lease, why)
            rejected.extend([lease.ref.sample_id] if taken else [])
            return taken

        queue.reject = counted_reject  # type: ignore[method-assign]
        return queue

    machine = make_queue_machine(
        lambda: LocalFeatureStore(max_samples=16),
        queue_factory,
        MachineConfig(untrainable=1),
        name="RedisRejectingMachine",
        replies=counted([]),
    )
    run_state_machine_as_test(machine)
    assert rejected and set(rejected) == {"s3"}, rejected


def test_redis_queue_follows_the_spec_when_every_first_reply_is_lost(shared_client: redis.Redis) -> None:
    """The same machine, every exact call's first reply lost: each retry must leave what one call would have.

    The runs lose the replies of every server function the machine calls (it never requeues or purges dead
    letters).
    """
    made: list[RedisLostReplies] = []
    machine = make_queue_machine(
        lambda: LocalFeatureStore(max_samples=16),
        queues_on(shared_client, "lossy"),
        name="LossyRedisMachine",
        replies=counted(made, always=EXACT_CALLS),
    )
    run_state_machine_as_test(machine)
    lost = sum((replies.lost_of for replies in made), collections.Counter[str]())
    assert set(lost) >= {"put", "put_many", "ack", "fail", "lose", "extend", "reclaim"}, f"replies lost: {dict(lost)}"


def retrying_as_new(queue: RedisSampleRefQueue) -> RedisSampleRefQueue:
    """A seeded defect: ``queue``'s link retries a call under a fresh call id and unmarked as a repeat, so the
    server cannot tell it from a new call and runs it again (only a put's token and an ack's dedup record still
    recognise a repeat)."""
    link = queue._link
    reload = link._call_reloading

    def anew(script: str, header: Callable[[str], str], args: tuple[Any, ...]) -> Any:
        def fresh(name: str) -> str:
            rest, call = header(name).rsplit("\t", 1)  # call: '+' (may repeat), the call id, ':' keep seconds
            ident, keep = call[1:].split(":", 1)
            return f"{rest}\t-{ident}x:{keep}"

        return reload(script, fresh, args)

    link._call_reloading = anew  # type: ignore[method-assign]
    return queue


def test_lost_replies_catch_a_retry_that_runs_the_call_again(shared_client: redis.Redis) -> None:
    """The lossy machine finds a link whose retry is not exact (the CI budget, derandomized, unshrunk): a retried
    extend granted twice, or a retried fail rejected as stale."""
    machine = make_queue_machine(
        lambda: LocalFeatureStore(max_samples=16),
        queues_on(shared_client, "anew"),
        name="RetryAnewMachine",
        replies=lambda queue: RedisLostReplies(retrying_as_new(queue)),
    )
    budget = settings(
        max_examples=200,
        stateful_step_count=40,
        deadline=None,
        database=None,
        derandomize=True,
        report_multiple_bugs=False,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    with pytest.raises(InvariantViolation) as caught:
        run_state_machine_as_test(machine, settings=budget)
    # a call run twice shows in the counters: against the kit's observations or against the spec's
    assert caught.value.invariant in ("inv11_counters_consistent", "inv12_agrees_with_spec_mirror"), str(caught.value)
