"""The Redis backend runs the lease machine on every lease, from what the server functions report."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from featurestream import LocalFeatureStore
from featurestream import VisibilityTimeout as VT
from featurestream.common.errors import IllegalTransition, LeaseLost
from featurestream.core import machines
from featurestream.testing import FakeClock, sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis import functions  # noqa: E402 - needs redis-py
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402

Factory = Callable[..., RedisSampleRefQueue]


class _UndroppedReclaimQueue(RedisSampleRefQueue):
    """Seeded defect on the server: a reap reports its reclaims but leaves the leases live and due, so the next
    call reports reclaiming them again. ``drop_leases`` is a local every function calls as an upvalue; the
    redefinition after the prelude replaces it for them (a prelude without that local fails to load)."""

    _UNDROPPED = """
local drop_for_real = drop_leases
drop_leases = function(keys, counter)
  if counter ~= 'reclaimed' then
    return drop_for_real(keys, counter)
  end
  redis.call('HINCRBY', K_STATS, counter, count_arg(#keys))
end
"""
    _library = functions.Library(functions.SCRIPTS, functions.PRELUDE + _UNDROPPED)


@pytest.fixture
def queue_defaults(clock: FakeClock) -> dict[str, Any]:
    return {"visibility_timeout": VT(10.0), "clock": clock}


@pytest.fixture
def fired(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(trigger, the model's state after it) of every lease-machine trigger the Redis backend fires."""
    seen: list[tuple[str, str]] = []

    def counting(machine: machines.TableMachine, trigger: str, model: Any) -> None:
        machines.fire(machine, trigger, model)
        if machine is machines.LEASE_MACHINE:
            seen.append((trigger, model.state))

    monkeypatch.setattr("featurestream.core.effects.fire", counting)
    return seen


def test_every_lifecycle_fires_the_lease_machine(make: Factory, fired: list[tuple[str, str]]) -> None:
    store = LocalFeatureStore(max_samples=64)
    queue = make(store)
    queue.put(store.put("s0", sample_tensors(0)))
    lease = queue.acquire(timeout=0)
    assert lease is not None
    queue.extend(lease)
    queue.ack(lease)
    assert fired == [("lease", "leased"), ("extend", "leased"), ("ack", "acked")]
    queue.put(store.put("s1", sample_tensors(1)))
    failing = queue.acquire(timeout=0)
    assert failing is not None
    queue.fail(failing)
    assert fired[-2:] == [("lease", "leased"), ("fail", "failed")]


def test_reclaims_move_the_machine_of_the_instance_that_learns_them(
    make: Factory, fired: list[tuple[str, str]], clock: FakeClock
) -> None:
    store = LocalFeatureStore(max_samples=64)
    consumer, reaper = make(store), make(store)
    consumer.put(store.put("s0", sample_tensors(0)))
    lease = consumer.acquire(timeout=0)
    assert lease is not None
    clock.advance(11.0)
    assert reaper.reclaim_expired() == 1  # another instance's lease: it learns of the reclaim from the server
    assert fired == [("lease", "leased"), ("reclaim", "reclaimed")]
    consumer.ack(lease)  # the server refuses the holder's proof: the holder's model learns the lease was reclaimed
    assert fired[-1] == ("reclaim", "reclaimed")
    with pytest.raises(LeaseLost):
        consumer.extend(lease)
    assert len(fired) == 3  # the model is reclaimed already: nothing more to fire


def test_a_server_that_reports_an_illegal_transition_is_caught(make: Factory, clock: FakeClock) -> None:
    store = LocalFeatureStore(max_samples=64)
    queue = make(store, _UndroppedReclaimQueue)
    queue.put(store.put("s0", sample_tensors(0)))
    lease = queue.acquire(timeout=0)
    assert lease is not None
    clock.advance(11.0)
    assert queue.reclaim_expired() == 1
    with pytest.raises(IllegalTransition) as caught:
        queue.reclaim_expired()  # the server reports reclaiming the reclaimed lease again
    error = caught.value
    assert (error.machine, error.state, error.trigger) == ("lease", "reclaimed", "reclaim")
    assert error.subject == f"lease {lease.lease_id} of sample 's0'"


def test_a_server_that_settles_a_lease_not_issued_here_is_caught(make: Factory) -> None:
    store = LocalFeatureStore(max_samples=64)
    queue = make(store)
    queue.put(store.put("s0", sample_tensors(0)))
    lease = queue.acquire(timeout=0)
    assert lease is not None
    queue._engine._models.clear()  # seeded defect on the client: it forgot the lease it holds
    with pytest.raises(IllegalTransition, match=rf"lease {lease.lease_id} is 'not issued to this instance'.*'ack'"):
        queue.ack(lease)
