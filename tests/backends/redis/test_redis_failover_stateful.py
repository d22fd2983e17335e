"""The library's stateful suite (``featurestream.testing``) against a replicated Redis, failovers among its faults.

The queue connects through the sentinels of a ``ReplicatedRedis`` (a primary, a replica, three sentinels) with
``min_replicas=1`` and declares both Redis faults (``featurestream.testing.redis_faults``): lost replies
(``replies=``) and lost primaries (``failovers=``). The machine's ``failover`` rule SIGKILLs the primary around a
state-changing call, with the call's effect on it alone, on the replica but unanswered, or just returned; a
replica is promoted, the old primary rejoins as a replica, and every invariant must hold on the new primary.
A failover costs seconds, so the runs are few, short and derandomized.
"""

from __future__ import annotations

import collections
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from featurestream import LocalFeatureStore
from featurestream.testing import (
    FAILOVER_MOMENTS,
    InvariantViolation,
    MachineConfig,
    make_queue_machine,
    sample_tensors,
)

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py
from featurestream.testing.redis_faults import FAILOVER_BOUND, RedisFailovers, RedisLostReplies  # noqa: E402 - needs redis-py
from featurestream.tools.redis_servers import ReplicatedRedis  # noqa: E402 - needs redis-py

# A call held up by a failover retries for this long: the promotion and the old primary's resync take seconds,
# a busy machine's stalled sentinels (TILT mode) sometimes tens of them.
RECONNECT = 60.0


def budget(examples: int) -> settings:
    """The kit's ``ci`` profile (derandomized, no database), ``examples`` runs of at most 50 steps, unshrunk: a
    failover costs seconds."""
    return settings(
        settings.get_profile("ci"),
        max_examples=examples,
        stateful_step_count=50,
        report_multiple_bugs=False,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


@pytest.fixture
def queues(cluster: ReplicatedRedis) -> Iterator[Callable[..., RedisSampleRefQueue]]:
    """``queue_factory`` for the machine: a fresh queue through the cluster's sentinels per run, all
    disconnected after the test."""
    cluster.wait_healthy()
    made: list[RedisSampleRefQueue] = []

    def queue_factory(store: LocalFeatureStore, **hooks: Any) -> RedisSampleRefQueue:
        queue = RedisSampleRefQueue(
            store,
            name=f"failover-{uuid.uuid4().hex}",
            sentinels=cluster.sentinel_addresses,
            service_name=cluster.service,
            min_replicas=1,
            reconnect_timeout=RECONNECT,
            **hooks,
        )
        made.append(queue)
        return queue

    yield queue_factory
    for queue in made:
        queue.disconnect()


def machine(
    cluster: ReplicatedRedis,
    queue_factory: Callable[..., RedisSampleRefQueue],
    name: str,
    failed_over: list[RedisFailovers],
    lost: list[RedisLostReplies],
) -> Any:
    """The kit with both faults; each run's ``RedisFailovers`` and ``RedisLostReplies`` kept in the lists."""

    def failovers(queue: RedisSampleRefQueue) -> RedisFailovers:
        failed_over.append(RedisFailovers(queue, cluster))
        return failed_over[-1]

    def replies(queue: RedisSampleRefQueue) -> RedisLostReplies:
        lost.append(RedisLostReplies(queue))
        return lost[-1]

    return make_queue_machine(
        lambda: LocalFeatureStore(max_samples=16),
        queue_factory,
        # The second failover promotes the old primary, back as a replica since the first. A call may wait out a
        # whole failover, a sentinel's own included (a stalled sentinel on a busy machine may start one).
        MachineConfig(failovers=2, bound=FAILOVER_BOUND),
        name=name,
        replies=replies,
        failovers=failovers,
    )


def test_replicated_redis_queue_follows_the_spec_across_failovers(
    cluster: ReplicatedRedis, queues: Callable[..., RedisSampleRefQueue]
) -> None:
    """Every rule of the spec machine, lost replies and failovers among them, against the replicated queue: a
    fifth of the runs fail over at least once (Hypothesis leaves the rule out of some runs), at every moment, and
    some lose a reply too."""
    failed_over: list[RedisFailovers] = []
    lost: list[RedisLostReplies] = []
    run_state_machine_as_test(
        machine(cluster, queues, "FailoverRedisMachine", failed_over, lost), settings=budget(examples=80)
    )
    moments = sum((fault.done for fault in failed_over), collections.Counter[str]())
    runs = sum(1 for fault in failed_over if fault.failovers())
    assert runs >= len(failed_over) // 5, f"{runs} of {len(failed_over)} runs failed over ({dict(moments)})"
    assert set(moments) == set(FAILOVER_MOMENTS), f"failovers by moment: {dict(moments)}"
    assert any(replies.lost() for replies in lost), "no run lost a reply"


def acknowledging_before_replication(queue: RedisSampleRefQueue) -> RedisSampleRefQueue:
    """A seeded defect: ``queue``'s link returns each call once the primary applied it (``min_replicas=0``, no
    ``WAIT``), though the server is replicated and the queue was asked for ``min_replicas=1``."""
    queue._link.min_replicas = 0
    return queue


@pytest.mark.parametrize(("at", "stands"), [("unreplicated", False), ("replicated", True), ("returned", True)])
def test_a_failover_keeps_what_reached_the_replica_and_nothing_else(
    cluster: ReplicatedRedis, queues: Callable[..., RedisSampleRefQueue], at: str, stands: bool
) -> None:
    """The fault itself, through a link that does not wait for replication: the put it reported done stands on
    the promoted replica exactly when the moment let its effect reach the replica."""
    store = LocalFeatureStore()
    queue = acknowledging_before_replication(queues(store))
    fault = RedisFailovers(queue, cluster)
    before = cluster.primary()
    fault.arm(at)
    queue.put(store.put("s0", sample_tensors(0)))  # returned: done, as far as this link says
    assert (fault.failovers(), fault.armed()) == (1, False)
    assert fault.promoted[0] is not before  # a replica promoted; and the old primary is back, as a replica
    assert [server.process is not None for server in cluster.servers] == [True, True]
    assert queue.pending_count() == int(stands)


@pytest.mark.parametrize("failovers", [-1, True, 1.0])
def test_a_machine_config_with_no_count_of_failovers_is_refused(failovers: Any) -> None:
    with pytest.raises(ValueError, match=f"MachineConfig.failovers must be an int >= 0, got {failovers!r}"):
        MachineConfig(failovers=failovers)


def test_a_failover_at_no_such_moment_is_refused(
    queues: Callable[..., RedisSampleRefQueue], cluster: ReplicatedRedis
) -> None:
    fault = RedisFailovers(queues(LocalFeatureStore()), cluster)
    with pytest.raises(ValueError, match="cannot fail over at 'sideways': the moments are"):
        fault.arm("sideways")
    assert (fault.armed(), fault.failovers()) == (False, 0)


def test_failovers_catch_a_queue_that_acknowledges_before_replication(
    cluster: ReplicatedRedis, queues: Callable[..., RedisSampleRefQueue]
) -> None:
    """The same machine finds a link that returns before a replica has the effect (the CI budget, derandomized,
    unshrunk): a call it reported done is undone by a failover, and the queue disagrees with what it reported."""
    failed_over: list[RedisFailovers] = []
    found = machine(
        cluster,
        lambda store, **hooks: acknowledging_before_replication(queues(store, **hooks)),
        "AcknowledgingEarlyMachine",
        failed_over,
        [],
    )
    with pytest.raises(InvariantViolation) as caught:
        run_state_machine_as_test(found, settings=budget(examples=40))
    assert failed_over[-1].done["unreplicated"] == 1, dict(failed_over[-1].done)
    # the call the failover undid shows as a lease, a count or a state the queue no longer has
    undone = ("inv01_one_live_lease_per_sample", "inv11_counters_consistent", "inv12_agrees_with_spec_mirror")
    assert caught.value.invariant in undone, str(caught.value)
