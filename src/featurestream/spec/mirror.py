"""A pure-Python mirror of ``spec/LeaseQueue.tla``: the same variables, the same actions, no threads.

The mirror is the spec in another notation, not a paraphrase: ``reachable_states``
enumerates exactly the states TLC explores for the same constants (a test pins
the two counts equal), and every action below carries the name of the TLA+
action it mirrors.

Step API (used by ``featurestream.testing`` to drive the implementation and the
mirror side by side). ``SpecMirror(constants)`` holds one spec state plus the
``QueueStats``-style counters; each method applies one spec action and returns
whether it was enabled / accepted (a refused or disabled action changes no spec
variable, but may bump a counter exactly like the implementation does):

- producer: ``store_put(sample, nbytes=None)`` (StorePut: bytes land in the store),
  ``put(sample)`` (Put: enqueue a stored sample), ``reput(sample)`` (Reput: a
  producer retries the put of a settled id; ``False`` = refused by dedup).
- consumers: ``acquire(consumer) -> LeaseToken | None`` (Acquire, FIFO head),
  ``ack(consumer, token)`` / ``fail(consumer, token)`` (Ack/Fail; ``False`` =
  stale or forged, counted in ``stale_rejected``), ``extend(consumer, token)``
  (Extend; ``False`` = ``LeaseLost``), ``get(consumer, sample)`` /
  ``release(consumer, sample)`` (store handles), ``crash(consumer)`` (forgets
  its leases and handles; the store still counts the handles).
- time and reaper: ``reclaim(sample)`` (Reclaim: the live lease's deadline passed
  and the reaper took it back -- time is abstract, so expiry and reclaim are one
  step), ``reclaim_expired(order)`` (Reclaim each sample of ``order``, in that
  order, as the implementation's deadline heap does; returns how many).
- backpressure and lifecycle: ``pause()``, ``resume()``, ``update_backpressure()``
  (what ``put_blocks_until_below`` evaluates: Pause or Resume if enabled, returns
  its name or ``None``), ``close()``, ``drain()``. With ``auto_drain=True`` (the
  default, as the implementation does atomically) ``close``/``ack``/``fail``/
  ``reclaim`` apply ``drain`` when it becomes enabled.

A ``LeaseToken`` is ``(sample, redelivery_count)``: the spec's name of one
delivery attempt. Forged tokens (never handed to that consumer) are rejected.

Observable state: ``status(sample)`` (``absent``/``stored``/``pending``/``leased``/
``acked``/``dead``), ``pending_order()``, ``resident()`` (sample ids whose bytes
are in the store), ``resident_bytes``, ``pending_count``, ``outstanding_count``,
``backpressure_state``, ``lifecycle_state``, ``redelivery_count(sample)``,
``live_token(sample)``, ``held(consumer)``, ``handles(consumer)``, ``dead_letters()``,
``stats()`` (dict keyed like ``QueueStats``: put, leased, acked, failed,
reclaimed, dead_lettered, extended, stale_rejected, dedup_refused,
producer_pauses, pending, outstanding), ``events`` (the implementation-style
trace of every applied action) and ``check_invariants()`` which raises
``AssertionError`` naming the first broken spec invariant or action property
(checked over the last step).

``bugs`` re-enables the reference defects A-E in the mirror, as the spec's
``Bug*`` constants do in TLA+.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import NamedTuple

__all__ = [
    "BUGS",
    "LEASE_STATES",
    "LEASE_TRANSITIONS",
    "STATUSES",
    "LeaseToken",
    "SpecConstants",
    "SpecMirror",
    "SpecState",
    "check_state",
    "check_step",
    "constants_from_config",
    "initial_state",
    "reachable_states",
    "successors",
]

LeaseToken = tuple[str, int]

NO_LEASE = "none"
LEASE_STATES = ("pending", "leased", "acked", "failed", "reclaimed")
LEASE_TRANSITIONS = (
    ("Acquire", "pending", "leased"),
    ("Extend", "leased", "leased"),
    ("Ack", "leased", "acked"),
    ("Fail", "leased", "failed"),
    ("Reclaim", "leased", "reclaimed"),
)
STATUSES = ("absent", "stored", "pending", "leased", "acked", "dead")
TERMINAL = frozenset({"acked", "dead"})
HELD_BY_QUEUE = frozenset({"pending", "leased"})
TERMINAL_LEASE = frozenset({"acked", "failed", "reclaimed"})
# One switch per reference defect (DESIGN.md "Known defects"), as the spec's Bug* constants.
BUGS = {
    "A": "BugStaleRelease: the last handle release frees a sample the queue still holds",
    "B": "BugNoScrub: a settled sample is only un-retained, so a crashed consumer's handle keeps it",
    "C": "BugNoDedup: a re-put of a settled id is accepted and delivered again",
    "D": "BugNoDeliveryLimit: failed/reclaimed samples are redelivered forever",
    "E": "BugNoReaper: expired leases are never reclaimed",
}
_COUNTER_OF_EVENT = {
    "Put": "put",
    "Acquire": "leased",
    "Ack": "acked",
    "Fail": "failed",
    "Reclaim": "reclaimed",
    "DeadLetter": "dead_lettered",
    "Extend": "extended",
    "StaleRejected": "stale_rejected",
    "DedupRefused": "dedup_refused",
    "Pause": "producer_pauses",
}
COUNTERS = tuple(dict.fromkeys(_COUNTER_OF_EVENT.values()))


@dataclasses.dataclass(frozen=True)
class SpecConstants:
    """The spec's CONSTANTS: ``Samples``, ``Consumers``, ``MaxDeliveries``, watermarks, ``MaxHeld``, ``Bug*``.

    ``max_held`` bounds the leases one consumer holds at once (``None``: no bound,
    as in the implementation; the model configs use 1 to keep TLC fast).
    ``sample_bytes`` is every sample's size in the model (the step API may
    override it per sample in ``store_put``).
    """

    samples: tuple[str, ...] = ("s1", "s2")
    consumers: tuple[str, ...] = ("c1", "c2")
    max_deliveries: int = 2
    high_watermark: int = 2
    low_watermark: int = 1
    max_held: int | None = 1
    sample_bytes: int = 1
    bugs: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for name in ("samples", "consumers"):
            values = getattr(self, name)
            if not values or len(set(values)) != len(values) or not all(isinstance(v, str) and v for v in values):
                raise ValueError(f"{name} must be non-empty distinct non-empty strings, got {values!r}")
        if isinstance(self.max_deliveries, bool) or not isinstance(self.max_deliveries, int) or self.max_deliveries < 1:
            raise ValueError(f"max_deliveries must be an int >= 1, got {self.max_deliveries!r}")
        if not 0 <= self.low_watermark < self.high_watermark:
            raise ValueError(
                f"watermarks need 0 <= low < high, got low={self.low_watermark!r} high={self.high_watermark!r}"
            )
        if self.max_held is not None and self.max_held < 1:
            raise ValueError(f"max_held must be >= 1 or None, got {self.max_held!r}")
        if self.sample_bytes < 1:
            raise ValueError(f"sample_bytes must be >= 1, got {self.sample_bytes!r}")
        unknown = set(self.bugs) - set(BUGS)
        if unknown:
            raise ValueError(f"unknown bugs {sorted(unknown)!r}; known: {sorted(BUGS)}")


class SpecState(NamedTuple):
    """The spec's VARIABLES; samples and consumers are indices into the constants' tuples."""

    status: tuple[str, ...]  # status[s]
    queue: tuple[int, ...]  # queue: the pending FIFO, head first
    deliveries: tuple[int, ...]  # deliveries[s]: redelivery_count of s's current lease
    lease: tuple[tuple[str, ...], ...]  # lease[s][k]: state of delivery attempt k of s
    held: tuple[frozenset[tuple[int, int]], ...]  # held[c]: lease tokens consumer c holds
    handles: tuple[frozenset[int], ...]  # handles[c]: samples consumer c has a store handle on
    hcount: tuple[int, ...]  # hcount[s]: handles the store counts for s
    resident: frozenset[int]  # resident: samples whose bytes the store holds
    retained: frozenset[int]  # retained: samples a queue holds (retain ... scrub)
    resident_bytes: int  # residentBytes: the store's byte counter
    backpressure: str  # bp: "flowing" | "paused"
    lifecycle: str  # lifecycle: "open" | "draining" | "drained"


class _Step(NamedTuple):
    state: SpecState
    events: tuple[tuple[str, int], ...]  # implementation-style trace events: (action, sample index or -1)
    token: tuple[int, int] | None = None


def initial_state(k: SpecConstants) -> SpecState:
    """``Init``."""
    n, m = len(k.samples), len(k.consumers)
    return SpecState(
        status=("absent",) * n,
        queue=(),
        deliveries=(0,) * n,
        lease=((NO_LEASE,) * (k.max_deliveries + 1),) * n,
        held=(frozenset(),) * m,
        handles=(frozenset(),) * m,
        hcount=(0,) * n,
        resident=frozenset(),
        retained=frozenset(),
        resident_bytes=0,
        backpressure="flowing",
        lifecycle="open",
    )


def _set(values: tuple, index: int, value: object) -> tuple:
    return (*values[:index], value, *values[index + 1 :])


def _fire(st: SpecState, action: str, s: int, attempt: int) -> tuple[tuple[str, ...], ...]:
    """``Fire``: move lease attempt ``attempt`` of ``s`` along ``action``'s edge of ``LeaseTransitions``."""
    for name, source, dest in LEASE_TRANSITIONS:
        if name == action:
            assert st.lease[s][attempt] == source, (action, st.lease[s][attempt])
            return _set(st.lease, s, _set(st.lease[s], attempt, dest))
    raise KeyError(action)


def _free(st: SpecState, s: int, size: int) -> SpecState:
    """The store drops ``s``'s bytes and its bookkeeping (``_forget``)."""
    if s not in st.resident:
        return st
    return st._replace(
        resident=st.resident - {s},
        retained=st.retained - {s},
        hcount=_set(st.hcount, s, 0),
        resident_bytes=st.resident_bytes - size,
    )


def _settle_store(k: SpecConstants, st: SpecState, s: int, size: int) -> SpecState:
    """``Scrub``: the sample became terminal; free it whatever handles are out (BugNoScrub: only un-retain)."""
    if "B" in k.bugs:
        st = st._replace(retained=st.retained - {s})
        return _free(st, s, size) if st.hcount[s] == 0 else st
    return _free(st, s, size)


def _maybe_drained(st: SpecState) -> SpecState:
    if st.lifecycle == "draining" and not any(x in HELD_BY_QUEUE for x in st.status):
        return st._replace(lifecycle="drained")
    return st


def _redeliver(k: SpecConstants, st: SpecState, s: int, size: int) -> tuple[SpecState, tuple[tuple[str, int], ...]]:
    """``Redeliver``: to the tail as a new lease, or dead once ``MaxDeliveries`` deliveries are spent."""
    nxt = st.deliveries[s] + 1
    if nxt >= k.max_deliveries and "D" not in k.bugs:
        st = st._replace(status=_set(st.status, s, "dead"))
        return _settle_store(k, st, s, size), (("DeadLetter", s),)
    return (
        st._replace(
            status=_set(st.status, s, "pending"),
            deliveries=_set(st.deliveries, s, nxt),
            lease=_set(st.lease, s, _set(st.lease[s], nxt, "pending")),
            queue=(*st.queue, s),
        ),
        (),
    )


# -- the actions (each mirrors the TLA+ action of the same name) -------------------------------------------
# Each returns None when disabled, else the successor state and the implementation trace events.


def a_store_put(k: SpecConstants, st: SpecState, s: int, size: int) -> _Step | None:
    """StorePut(s): ``FeatureStore.put`` -- the producer writes a new sample's bytes."""
    if st.status[s] != "absent":
        return None
    return _Step(
        st._replace(
            status=_set(st.status, s, "stored"),
            resident=st.resident | {s},
            resident_bytes=st.resident_bytes + size,
        ),
        (),
    )


def a_put(k: SpecConstants, st: SpecState, s: int) -> _Step | None:
    """Put(s): ``SampleRefQueue.put`` -- enqueue a stored sample at the tail; the store retains it."""
    if st.status[s] != "stored" or st.lifecycle != "open":
        return None
    return _Step(
        st._replace(
            status=_set(st.status, s, "pending"),
            deliveries=_set(st.deliveries, s, 0),
            lease=_set(st.lease, s, _set(st.lease[s], 0, "pending")),
            queue=(*st.queue, s),
            retained=st.retained | ({s} & st.resident),
        ),
        (("Put", s),),
    )


def a_reput(k: SpecConstants, st: SpecState, s: int, size: int) -> _Step | None:
    """Reput(s): ``put`` of an id already acked/dead -- refused by dedup (BugNoDedup: accepted again)."""
    if st.status[s] not in TERMINAL or st.lifecycle != "open":
        return None
    if "C" not in k.bugs:
        return _Step(st, (("DedupRefused", s),))
    fresh = (NO_LEASE,) * (k.max_deliveries + 1)
    return _Step(
        st._replace(
            status=_set(st.status, s, "pending"),
            deliveries=_set(st.deliveries, s, 0),
            lease=_set(st.lease, s, _set(fresh, 0, "pending")),
            queue=(*st.queue, s),
            resident=st.resident | {s},
            retained=st.retained | {s},
            resident_bytes=st.resident_bytes + (0 if s in st.resident else size),
        ),
        (("Put", s),),
    )


def a_acquire(k: SpecConstants, st: SpecState, c: int) -> _Step | None:
    """Acquire(c): ``acquire`` -- lease the head of the pending FIFO to consumer ``c``."""
    if not st.queue or (k.max_held is not None and len(st.held[c]) >= k.max_held):
        return None
    s = st.queue[0]
    attempt = st.deliveries[s]
    token = (s, attempt)
    return _Step(
        st._replace(
            queue=st.queue[1:],
            status=_set(st.status, s, "leased"),
            lease=_fire(st, "Acquire", s, attempt),
            held=_set(st.held, c, st.held[c] | {token}),
        ),
        (("Acquire", s),),
        token,
    )


def _is_live(st: SpecState, token: tuple[int, int]) -> bool:
    s, attempt = token
    return st.lease[s][attempt] == "leased"


def a_ack(k: SpecConstants, st: SpecState, c: int, token: tuple[int, int], size: int) -> _Step | None:
    """Ack(c, l): ``ack`` -- settle the live lease (sample acked, store scrubs it) or reject a stale one."""
    if token not in st.held[c]:
        return None
    st = st._replace(held=_set(st.held, c, st.held[c] - {token}))
    if not _is_live(st, token):
        return _Step(st, (("StaleRejected", token[0]),))
    s, attempt = token
    st = st._replace(status=_set(st.status, s, "acked"), lease=_fire(st, "Ack", s, attempt))
    return _Step(_settle_store(k, st, s, size), (("Ack", s),))


def a_fail(k: SpecConstants, st: SpecState, c: int, token: tuple[int, int], size: int) -> _Step | None:
    """Fail(c, l): ``fail`` -- give the live lease back (redeliver or dead-letter) or reject a stale one."""
    if token not in st.held[c]:
        return None
    st = st._replace(held=_set(st.held, c, st.held[c] - {token}))
    if not _is_live(st, token):
        return _Step(st, (("StaleRejected", token[0]),))
    s, attempt = token
    st = st._replace(lease=_fire(st, "Fail", s, attempt))
    st, events = _redeliver(k, st, s, size)
    return _Step(st, (("Fail", s), *events))


def a_extend(k: SpecConstants, st: SpecState, c: int, token: tuple[int, int]) -> _Step | None:
    """Extend(c, l): ``extend`` -- push a live lease's deadline (``LeaseLost`` for a stale one).

    Time is abstract (``Reclaim`` may take any live lease), so a granted
    extension changes no variable: it is a stuttering step of the spec.
    """
    if token not in st.held[c]:
        return None
    if not _is_live(st, token):
        return _Step(st, (("StaleRejected", token[0]),))
    _fire(st, "Extend", *token)
    return _Step(st, (("Extend", token[0]),))


def a_reclaim(k: SpecConstants, st: SpecState, s: int, size: int) -> _Step | None:
    """Reclaim(s): ``reclaim_expired`` / the reap at the start of every call (BugNoReaper: never).

    Time is abstract: any live lease may have passed its deadline, so the
    clock advancing and the reaper running are one step.
    """
    if st.status[s] != "leased" or "E" in k.bugs:
        return None
    st = st._replace(lease=_fire(st, "Reclaim", s, st.deliveries[s]))
    st, events = _redeliver(k, st, s, size)
    return _Step(st, (("Reclaim", s), *events))


def a_get(k: SpecConstants, st: SpecState, c: int, s: int) -> _Step | None:
    """Get(c, s): ``FeatureStore.get`` by a consumer holding a (possibly stale) lease of ``s``."""
    if s not in st.resident or s in st.handles[c] or not any(t[0] == s for t in st.held[c]):
        return None
    return _Step(
        st._replace(handles=_set(st.handles, c, st.handles[c] | {s}), hcount=_set(st.hcount, s, st.hcount[s] + 1)),
        (),
    )


def a_release(k: SpecConstants, st: SpecState, c: int, s: int, size: int) -> _Step | None:
    """Release(c, s): ``FeatureStore.release`` -- frees an unretained sample on its last handle.

    BugStaleRelease: the last release frees the sample even while a queue retains it.
    """
    if s not in st.handles[c]:
        return None
    st = st._replace(handles=_set(st.handles, c, st.handles[c] - {s}))
    if s not in st.resident or st.hcount[s] == 0:  # a scrubbed sample's handle: releasing it is a no-op
        return _Step(st, ())
    st = st._replace(hcount=_set(st.hcount, s, st.hcount[s] - 1))
    if st.hcount[s] == 0 and (s not in st.retained or "A" in k.bugs):
        st = _free(st, s, size)
    return _Step(st, ())


def a_crash(k: SpecConstants, st: SpecState, c: int) -> _Step | None:
    """Crash(c): the consumer process dies, forgetting its leases and handles (the store still counts them)."""
    if not st.held[c] and not st.handles[c]:
        return None
    return _Step(st._replace(held=_set(st.held, c, frozenset()), handles=_set(st.handles, c, frozenset())), ())


def a_pause(k: SpecConstants, st: SpecState) -> _Step | None:
    """Pause: ``put_blocks_until_below`` sees resident bytes at/above the high watermark."""
    if st.backpressure != "flowing" or st.resident_bytes < k.high_watermark:
        return None
    return _Step(st._replace(backpressure="paused"), (("Pause", -1),))


def a_resume(k: SpecConstants, st: SpecState) -> _Step | None:
    """Resume: ``put_blocks_until_below`` sees resident bytes at/below the low watermark."""
    if st.backpressure != "paused" or st.resident_bytes > k.low_watermark:
        return None
    return _Step(st._replace(backpressure="flowing"), (("Resume", -1),))


def a_close(k: SpecConstants, st: SpecState) -> _Step | None:
    """Close: ``close`` -- refuse further puts; acquire keeps draining."""
    if st.lifecycle != "open":
        return None
    return _Step(st._replace(lifecycle="draining"), (("Close", -1),))


def a_drain(k: SpecConstants, st: SpecState) -> _Step | None:
    """Drain: the closed queue holds nothing pending or leased (``_maybe_drained``)."""
    nxt = _maybe_drained(st)
    if nxt is st:
        return None
    return _Step(nxt, (("Drain", -1),))


def successors(k: SpecConstants, st: SpecState) -> Iterator[SpecState]:
    """``Next``: every state one action away from ``st`` (stuttering steps included)."""
    size = k.sample_bytes
    n, m = len(k.samples), len(k.consumers)
    steps: list[_Step | None] = [a_pause(k, st), a_resume(k, st), a_close(k, st), a_drain(k, st)]
    for s in range(n):
        steps += [
            a_store_put(k, st, s, size),
            a_put(k, st, s),
            a_reput(k, st, s, size),
            a_reclaim(k, st, s, size),
        ]
    for c in range(m):
        steps += [a_acquire(k, st, c), a_crash(k, st, c)]
        for token in st.held[c]:
            steps += [a_ack(k, st, c, token, size), a_fail(k, st, c, token, size), a_extend(k, st, c, token)]
        for s in range(n):
            steps += [a_get(k, st, c, s), a_release(k, st, c, s, size)]
    for step in steps:
        if step is not None:
            yield step.state


def reachable_states(constants: SpecConstants, limit: int | None = None, *, check: bool = False) -> int:
    """Breadth-first count of the distinct states reachable from ``Init`` (TLC's "distinct states").

    With ``check``, every state invariant and action property is asserted on
    the way, as TLC does (``AssertionError`` naming the first one broken).
    Raises ``RuntimeError`` past ``limit`` states, so a runaway model fails fast.
    """
    start = initial_state(constants)
    seen = {start}
    frontier = deque([start])
    if check:
        check_state(constants, start)
    while frontier:
        st = frontier.popleft()
        for nxt in successors(constants, st):
            if check:
                check_step(constants, st, nxt)
                check_state(constants, nxt)
            if nxt not in seen:
                seen.add(nxt)
                if limit is not None and len(seen) > limit:
                    raise RuntimeError(f"more than {limit} reachable states for {constants!r}")
                frontier.append(nxt)
    return len(seen)


# -- invariants (same names as the TLA+ definitions) --------------------------------------------------------


def check_state(k: SpecConstants, st: SpecState, sizes: Mapping[int, int] | None = None) -> None:
    """Assert every state invariant of the spec; the message starts with the invariant's TLA+ name."""
    n = len(k.samples)

    def size(s: int) -> int:
        return sizes.get(s, k.sample_bytes) if sizes else k.sample_bytes

    def name(s: int) -> str:
        return k.samples[s]

    for s in range(n):
        live = [a for a, x in enumerate(st.lease[s]) if x == "leased"]
        pend = [a for a, x in enumerate(st.lease[s]) if x == "pending"]
        assert len(live) <= 1 and (st.status[s] == "leased") == bool(live), (
            f"OneLiveLease: sample {name(s)!r} has live leases {live} with status {st.status[s]!r}"
        )
        assert (st.status[s] == "pending") == (st.queue.count(s) == 1 and len(pend) == 1), (
            f"OneLiveLease: sample {name(s)!r} status {st.status[s]!r}, queued {st.queue.count(s)}x, "
            f"pending leases {pend}"
        )
        if st.status[s] in HELD_BY_QUEUE:
            assert s in st.resident, f"NoLoss: sample {name(s)!r} is {st.status[s]} but not resident in the store"
        if st.status[s] in TERMINAL:
            assert s not in st.resident, f"NoLeak: sample {name(s)!r} is {st.status[s]} but still resident"
        assert st.deliveries[s] < k.max_deliveries, (
            f"BoundedDelivery: sample {name(s)!r} redelivery_count {st.deliveries[s]} >= MaxDeliveries "
            f"{k.max_deliveries}"
        )
    total = sum(size(s) for s in st.resident)
    assert st.resident_bytes == total and st.resident_bytes >= 0 and all(h >= 0 for h in st.hcount), (
        f"ResidencyExact: residentBytes {st.resident_bytes} but resident samples sum to {total}"
    )
    if st.lifecycle == "drained":
        busy = [name(s) for s in range(n) if st.status[s] in HELD_BY_QUEUE]
        assert not busy, f"CloseDrain: drained while {busy} are pending or leased"


def check_step(k: SpecConstants, before: SpecState, after: SpecState) -> None:
    """Assert every action property of the spec over one step ``before -> after``."""
    for s, sample in enumerate(k.samples):
        assert before.status[s] != "acked" or after.status[s] == "acked", (
            f"ExactlyOnce: acked sample {sample!r} became {after.status[s]!r}"
        )
        for attempt, (was, now) in enumerate(zip(before.lease[s], after.lease[s], strict=True)):
            if was in TERMINAL_LEASE:
                assert now == was, f"StaleAckRejection: lease ({sample!r}, {attempt}) changed {was} -> {now}"
            if was != now and was != NO_LEASE:
                assert any(src == was and dst == now for _, src, dst in LEASE_TRANSITIONS), (
                    f"LeaseStepsFollowMachine: lease ({sample!r}, {attempt}) moved {was} -> {now}"
                )
        if before.lifecycle != "open" and before.status[s] in ("absent", "stored"):
            assert after.status[s] in ("absent", "stored"), (
                f"ClosedRefusesPuts: sample {sample!r} was enqueued after close ({after.status[s]!r})"
            )
    if before.backpressure == "flowing" and after.backpressure == "paused":
        assert before.resident_bytes >= k.high_watermark, (
            f"Hysteresis: paused at {before.resident_bytes} B, below the high watermark {k.high_watermark}"
        )
    if before.backpressure == "paused" and after.backpressure == "flowing":
        assert before.resident_bytes <= k.low_watermark, (
            f"Hysteresis: resumed at {before.resident_bytes} B, above the low watermark {k.low_watermark}"
        )
    assert before.lifecycle != "drained" or after.lifecycle == "drained", "ClosedRefusesPuts: a drained queue reopened"


# -- the step API -----------------------------------------------------------------------------------------


class SpecMirror:
    """One spec state driven action by action (see the module docstring for the API)."""

    def __init__(
        self, constants: SpecConstants, *, sizes: Mapping[str, int] | None = None, auto_drain: bool = True
    ) -> None:
        self.constants = constants
        self.auto_drain = auto_drain
        self._sample_index = {s: i for i, s in enumerate(constants.samples)}
        self._consumer_index = {c: i for i, c in enumerate(constants.consumers)}
        self._sizes: dict[int, int] = {}
        for sample, nbytes in (sizes or {}).items():
            self._sizes[self._s(sample)] = nbytes
        self.state = initial_state(constants)
        self._previous = self.state
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._dead: list[str] = []
        self.events: list[tuple[str, dict[str, object]]] = []

    # -- name lookup ------------------------------------------------------
    def _s(self, sample: str) -> int:
        try:
            return self._sample_index[sample]
        except KeyError:
            raise KeyError(f"unknown sample {sample!r}; the mirror's samples are {self.constants.samples}") from None

    def _c(self, consumer: str) -> int:
        try:
            return self._consumer_index[consumer]
        except KeyError:
            raise KeyError(
                f"unknown consumer {consumer!r}; the mirror's consumers are {self.constants.consumers}"
            ) from None

    def _token(self, token: LeaseToken) -> tuple[int, int]:
        sample, attempt = token
        return self._s(sample), attempt

    def _size(self, s: int) -> int:
        return self._sizes.get(s, self.constants.sample_bytes)

    # -- applying actions ---------------------------------------------------
    def _apply(self, step: _Step | None, drain: bool = False) -> bool:
        if step is None:
            return False
        self._previous = self.state
        self.state = step.state
        events = list(step.events)
        if drain and self.auto_drain:
            drained = a_drain(self.constants, self.state)
            if drained is not None:
                self.state = drained.state
                events += drained.events
        for action, s in events:
            counter = _COUNTER_OF_EVENT.get(action)
            if counter is not None:
                self._counts[counter] += 1
            if action == "DeadLetter":
                self._dead.append(self.constants.samples[s])
            self.events.append((action, {"sample_id": self.constants.samples[s]} if s >= 0 else {}))
        return not any(a in ("StaleRejected", "DedupRefused") for a, _ in step.events)

    def store_put(self, sample: str, nbytes: int | None = None) -> bool:
        """StorePut: the producer writes ``sample`` (``nbytes`` overrides the model size) into the store."""
        s = self._s(sample)
        if nbytes is not None and self.state.status[s] == "absent":
            self._sizes[s] = nbytes
        return self._apply(a_store_put(self.constants, self.state, s, self._size(s)))

    def put(self, sample: str) -> bool:
        """Put: enqueue a stored sample; ``False`` if not stored-and-unqueued or the queue is closed."""
        return self._apply(a_put(self.constants, self.state, self._s(sample)))

    def reput(self, sample: str) -> bool:
        """Reput: re-put of an acked/dead id; ``False`` when refused (dedup) or not applicable."""
        s = self._s(sample)
        return self._apply(a_reput(self.constants, self.state, s, self._size(s)))

    def acquire(self, consumer: str) -> LeaseToken | None:
        """Acquire: the FIFO head's new lease token, or ``None`` (empty, or the consumer holds ``max_held``)."""
        step = a_acquire(self.constants, self.state, self._c(consumer))
        if not self._apply(step):
            return None
        assert step is not None and step.token is not None
        s, attempt = step.token
        return self.constants.samples[s], attempt

    def _settle(self, action: Callable[..., _Step | None], consumer: str, token: LeaseToken, *size: int) -> bool:
        c = self._c(consumer)
        t = self._token(token)
        step = action(self.constants, self.state, c, t, *size)
        if step is None:  # forged: a token this consumer never held; rejected, nothing changes
            self._apply(_Step(self.state, (("StaleRejected", t[0]),)))
            return False
        return self._apply(step, drain=True)

    def ack(self, consumer: str, token: LeaseToken) -> bool:
        """Ack: ``True`` when the live lease was acked; ``False`` for a stale or forged token."""
        return self._settle(a_ack, consumer, token, self._size(self._s(token[0])))

    def fail(self, consumer: str, token: LeaseToken) -> bool:
        """Fail: ``True`` when the live lease was failed (redelivered or dead-lettered)."""
        return self._settle(a_fail, consumer, token, self._size(self._s(token[0])))

    def extend(self, consumer: str, token: LeaseToken) -> bool:
        """Extend: ``True`` when granted; ``False`` is the implementation's ``LeaseLost``."""
        return self._settle(a_extend, consumer, token)

    def reclaim(self, sample: str) -> bool:
        """Reclaim: ``sample``'s live lease passed its deadline and the reaper took it back."""
        s = self._s(sample)
        return self._apply(a_reclaim(self.constants, self.state, s, self._size(s)), drain=True)

    def reclaim_expired(self, order: Iterable[str]) -> int:
        """Reclaim the live leases of ``order`` (the implementation reaps in deadline order); return how many."""
        return sum(self.reclaim(sample) for sample in order)

    def get(self, consumer: str, sample: str) -> bool:
        """Get: the consumer opens a store handle on a resident sample it holds a lease of."""
        return self._apply(a_get(self.constants, self.state, self._c(consumer), self._s(sample)))

    def release(self, consumer: str, sample: str) -> bool:
        """Release: the consumer drops its handle on ``sample``."""
        s = self._s(sample)
        return self._apply(a_release(self.constants, self.state, self._c(consumer), s, self._size(s)))

    def crash(self, consumer: str) -> bool:
        """Crash: the consumer forgets its leases and handles."""
        return self._apply(a_crash(self.constants, self.state, self._c(consumer)))

    def pause(self) -> bool:
        return self._apply(a_pause(self.constants, self.state))

    def resume(self) -> bool:
        return self._apply(a_resume(self.constants, self.state))

    def update_backpressure(self) -> str | None:
        """Apply Pause or Resume if enabled (as ``put_blocks_until_below`` does); return which."""
        if self.pause():
            return "Pause"
        if self.resume():
            return "Resume"
        return None

    def close(self) -> bool:
        return self._apply(a_close(self.constants, self.state), drain=True)

    def drain(self) -> bool:
        return self._apply(a_drain(self.constants, self.state))

    # -- observation ----------------------------------------------------------
    def status(self, sample: str) -> str:
        return self.state.status[self._s(sample)]

    def pending_order(self) -> list[str]:
        return [self.constants.samples[s] for s in self.state.queue]

    def resident(self) -> set[str]:
        return {self.constants.samples[s] for s in self.state.resident}

    @property
    def resident_bytes(self) -> int:
        return self.state.resident_bytes

    @property
    def pending_count(self) -> int:
        return len(self.state.queue)

    @property
    def outstanding_count(self) -> int:
        return self.state.status.count("leased")

    @property
    def backpressure_state(self) -> str:
        return self.state.backpressure

    @property
    def lifecycle_state(self) -> str:
        return self.state.lifecycle

    def redelivery_count(self, sample: str) -> int:
        return self.state.deliveries[self._s(sample)]

    def live_token(self, sample: str) -> LeaseToken | None:
        """The token of ``sample``'s live lease, if it is leased."""
        s = self._s(sample)
        return (sample, self.state.deliveries[s]) if self.state.status[s] == "leased" else None

    def held(self, consumer: str) -> set[LeaseToken]:
        return {(self.constants.samples[s], a) for s, a in self.state.held[self._c(consumer)]}

    def handles(self, consumer: str) -> set[str]:
        return {self.constants.samples[s] for s in self.state.handles[self._c(consumer)]}

    def dead_letters(self) -> list[str]:
        return list(self._dead)

    def stats(self) -> dict[str, int]:
        """Counters named like ``QueueStats`` fields, plus the ``pending``/``outstanding`` gauges."""
        return {**self._counts, "pending": self.pending_count, "outstanding": self.outstanding_count}

    def check_invariants(self) -> None:
        """Raise ``AssertionError`` naming the first broken invariant (state, and the last step's properties)."""
        check_state(self.constants, self.state, self._sizes)
        check_step(self.constants, self._previous, self.state)


_BUG_SWITCHES = {
    "BugStaleRelease": "A",
    "BugNoScrub": "B",
    "BugNoDedup": "C",
    "BugNoDeliveryLimit": "D",
    "BugNoReaper": "E",
}


def constants_from_config(text: str) -> SpecConstants:
    """The ``SpecConstants`` of a TLC model config's ``CONSTANTS`` (model values become their names)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.split("\\*", 1)[0].partition("=")
        if sep and name.strip().isidentifier():
            values[name.strip()] = value.strip()

    def names(key: str) -> tuple[str, ...]:
        return tuple(v.strip() for v in values[key].strip("{}").split(",") if v.strip())

    return SpecConstants(
        samples=names("Samples"),
        consumers=names("Consumers"),
        max_deliveries=int(values["MaxDeliveries"]),
        high_watermark=int(values["HighWatermark"]),
        low_watermark=int(values["LowWatermark"]),
        max_held=int(values["MaxHeld"]),
        sample_bytes=int(values["SampleBytes"]),
        bugs=frozenset(bug for switch, bug in _BUG_SWITCHES.items() if values.get(switch) == "TRUE"),
    )
