"""A pure-Python mirror of ``spec/LeaseQueue.tla``: the same variables, the same actions, no threads.

The mirror is the spec in another notation, not a paraphrase: ``reachable_states``
enumerates exactly the states TLC explores for the same constants (a test pins
the two counts equal, with every invariant, action property and deadlock
freedom checked on the way), and every action below carries the name of the
TLA+ action it mirrors.

It is one module, longer than the 600 lines every other module of the package stays under, on purpose: it
follows ``spec/LeaseQueue.tla`` action by action and in the spec's order, so a reader checks one against the
other side by side; split by size, an action's guard and effect would sit apart from the spec's.

Step API (used by ``featurestream.testing`` to drive the implementation and the
mirror side by side). ``SpecMirror(constants)`` holds one spec state plus the
``QueueStats``-style counters; each method applies one spec action and returns
whether it was enabled / accepted (a refused or disabled action changes no spec
variable, but may bump a counter exactly like the implementation does):

- queue-level producer calls, as trace validation sees them (no producer
  process, no backpressure): ``store_put(sample, nbytes=None)`` (StorePut: bytes
  land in the store), ``put(sample)`` (Put: enqueue a stored sample; ``put``
  never blocks), ``reput(sample)`` (Reput: a producer retries the put of a
  settled id; ``False`` = refused by dedup).
- producer processes (the spec's ``Producers``; ``SpecConstants.producers``):
  ``producer_store(producer, sample, nbytes=None)`` (ProducerStore: the
  producer writes the store and enters ``put_blocks_until_below``),
  ``producer_pause(producer)`` / ``producer_resume(producer)`` (PauseP/ResumeP:
  the hysteresis step of a waiting producer's round), ``producer_enqueue(producer)``
  (Enqueue, or RetainFails when a ``retain`` fault is armed; ``False`` when the
  rule says wait), ``producer_poll(producer)`` (one whole round: health, the
  hysteresis, then the enqueue if allowed; returns what happened),
  ``producer_abort(producer)`` (Abort: ``abort_when()``), ``producer_closed(producer)``
  (ClosedRaise: close woke the producer and its put raised), ``producer_discard(producer)``
  (Discard: the producer evicts the sample whose put raised), ``producer_state(producer)``,
  ``producer_sample(producer)``, ``may_enqueue()`` (the backpressure rule).
- dead-letter repair (``SpecConstants.keep_dead``: the spec's ``KeepDead``, a dead
  letter's bytes stay retained): ``requeue_dead_letter(sample)`` (RequeueDeadLetter:
  a dead letter whose bytes are kept goes back to the pending tail with a fresh
  delivery budget, out of the dedup window; ``False`` = refused -- not a dead
  letter, bytes not kept, or the queue drained -- and nothing changed; a lease
  token of the old incarnation still held names the new one, so drive it only
  once no consumer holds one), ``purge_dead_letter(sample)`` (PurgeDeadLetter: the
  dead letter leaves the list and its kept bytes are scrubbed -- an armed ``scrub``
  fault puts them in the backlog; ``False`` = not a dead letter), ``kept()``.
- store faults: ``arm_fault(call)`` with ``call`` one of ``FAULT_CALLS``
  (``retain``, ``scrub``, ``unretain``, ``health``, ``gc``): the next action that
  makes that store call takes the spec's failing branch (one-shot), as a
  fault-injecting store does. ``armed_faults()``, ``clear_faults()``. A failed
  scrub (during ack, fail or reclaim) leaves the settlement standing and puts
  the sample in the backlog; ``retry_scrub(sample)`` (RetryScrub: the retry a
  later queue operation or ``gc`` makes; a ``gc``/``scrub`` fault armed makes
  it fail again), ``retry_backlog()`` (retry every backlog entry), ``backlog()``.
- consumers: ``acquire(consumer) -> LeaseToken | None`` (Acquire, FIFO head),
  ``ack(consumer, token)`` / ``fail(consumer, token)`` (Ack/Fail; ``False`` =
  stale or forged, counted in ``stale_rejected``), ``reject(consumer, token)``
  (Reject: an ``untrainable`` sample dead-lettered at once; counted in ``failed``), ``extend(consumer, token)``
  (Extend; ``False`` = ``LeaseLost``), ``give_back(consumer, token)`` (GiveBack:
  an unused lease goes back to the pending tail, its delivery not counted;
  ``False`` = stale), ``get(consumer, sample)`` /
  ``release(consumer, sample)`` (store handles), ``crash(consumer)`` (forgets
  its leases and handles; the store still counts the handles).
- time and reaper: ``reclaim(sample)`` (Reclaim: the live lease's deadline passed
  and the reaper took it back -- time is abstract, so expiry and reclaim are one
  step), ``reclaim_expired(order)`` (Reclaim each sample of ``order``, in that
  order, as the implementation's deadline heap does; returns how many).
- backpressure and lifecycle: ``pause()``, ``resume()``, ``update_backpressure()``
  (what ``put_blocks_until_below`` evaluates: Pause or Resume if enabled, returns
  its name or ``None``), ``close()``, ``drain()``, ``finished()`` (the spec's
  ``Done`` is enabled). With ``auto_drain=True`` (the default, as the
  implementation does atomically) ``close``/``ack``/``fail``/``reclaim`` drain
  when nothing is pending or leased (events ``Close``/.../``Drain``).

A ``LeaseToken`` is ``(sample, redelivery_count)``: the spec's name of one
delivery attempt. Forged tokens (never handed to that consumer) are rejected.

Observable state: ``status(sample)`` (``absent``/``stored``/``pending``/``leased``/
``acked``/``dead``/``discarded``), ``pending_order()``, ``resident()`` (sample ids
whose bytes are in the store), ``resident_bytes``, ``pending_count``,
``outstanding_count``, ``backpressure_state``, ``lifecycle_state``,
``redelivery_count(sample)``, ``live_token(sample)``, ``held(consumer)``,
``handles(consumer)``, ``dead_letters()``, ``dedup_window()``, ``stats()`` (dict
keyed like ``QueueStats``: put, leased, acked, failed, reclaimed, dead_lettered,
extended, stale_rejected, dedup_refused, producer_pauses, plus store_faults and
scrub_retries, and the ``pending``/``outstanding`` gauges), ``events`` (the
implementation-style trace of every applied action: ``(name, fields)``, names
from ``featurestream.core.events``; a failed store call is ``StoreFault`` with
``call``, a retried one that went through ``ScrubRetried``) and
``check_invariants()`` which raises ``AssertionError`` naming the first broken
spec invariant or action property (checked over the last step).
``ResidencyBound`` is checked only while every enqueue went through a producer
(``put``/``store_put`` bypass backpressure, as ``SampleRefQueue.put`` does).

``bugs`` re-enables defects as the spec's ``Bug*`` constants do: the reference's
A-E, ``P`` (BugProducerBytesCounted: the old backpressure rule) and ``S``
(BugScrubFailUnsettles: an ack whose scrub fails is not recorded as settled).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

from featurestream.core.events import (
    ACK,
    ACQUIRE,
    CLOSE,
    DEAD_LETTER,
    DEDUP_REFUSED,
    DRAIN,
    EXTEND,
    FAIL,
    GIVE_BACK,
    PAUSE,
    PURGE_DEAD_LETTER,
    PUT,
    RECLAIM,
    REQUEUE_DEAD_LETTER,
    RESUME,
    SCRUB_RETRIED,
    STALE_REJECTED,
    STORE_FAULT,
)
from featurestream.core.machines import HELD, LEASE, SETTLED

__all__ = [
    "BUGS",
    "FAULT_CALLS",
    "LEASE_STATES",
    "LEASE_TRANSITIONS",
    "PRODUCER_STATES",
    "STATUSES",
    "LeaseToken",
    "SpecConstants",
    "SpecMirror",
    "SpecState",
    "check_state",
    "check_step",
    "constants_from_config",
    "initial_state",
    "labelled_successors",
    "reachable_states",
    "successors",
]

LeaseToken = tuple[str, int]

NO_LEASE = "none"
NO_SAMPLE = -1
LEASE_STATES = LEASE.states
LEASE_TRANSITIONS = tuple((t.spec_action, t.source, t.dest) for t in LEASE.transitions)
STATUSES = ("absent", "stored", "pending", "leased", "acked", "dead", "discarded")
PRODUCER_STATES = ("idle", "waiting", "aborted")
TERMINAL = frozenset(SETTLED)
HELD_BY_QUEUE = frozenset(HELD)
TERMINAL_LEASE = frozenset(LEASE.terminal)
FAULT_CALLS = ("retain", "scrub", "unretain", "health", "gc")
# One switch per defect, as the spec's Bug* constants.
BUGS = {
    "A": "BugStaleRelease: the last handle release frees a sample the queue still holds",
    "B": "BugNoScrub: a settled sample is only un-retained, so a crashed consumer's handle keeps it",
    "C": "BugNoDedup: a re-put of a settled id is accepted and delivered again",
    "D": "BugNoDeliveryLimit: failed/reclaimed samples are redelivered forever",
    "E": "BugNoReaper: expired leases are never reclaimed",
    "P": "BugProducerBytesCounted: a paused producer never enqueues, even into an empty queue",
    "S": "BugScrubFailUnsettles: an ack whose scrub fails is not recorded as settled (re-put accepted)",
    "R": "BugRequeueAnySettled: requeue_dead_letters takes any settled id, acked or its bytes gone",
    "O": "BugOnlyBytes: only bytes pause producers, not the store's sample-count cap",
    "L": "BugLostRedelivered: a consumer that finds a sample lost fails it, so the queue redelivers it",
    "U": "BugUntrainedAcked: reject acks the sample its schema refused, so it is counted as trained",
}
_COUNTER_OF_EVENT = {
    PUT: "put",
    ACQUIRE: "leased",
    ACK: "acked",
    FAIL: "failed",
    GIVE_BACK: "given_back",
    RECLAIM: "reclaimed",
    DEAD_LETTER: "dead_lettered",
    EXTEND: "extended",
    STALE_REJECTED: "stale_rejected",
    DEDUP_REFUSED: "dedup_refused",
    PAUSE: "producer_pauses",
    STORE_FAULT: "store_faults",
    SCRUB_RETRIED: "scrub_retries",
    REQUEUE_DEAD_LETTER: "requeued",
    PURGE_DEAD_LETTER: "purged",
}
COUNTERS = tuple(dict.fromkeys(_COUNTER_OF_EVENT.values()))


@dataclasses.dataclass(frozen=True)
class SpecConstants:
    """The spec's CONSTANTS and model parameters.

    ``samples``, ``consumers``, ``producers`` (``Producers``; the step API's
    ``put`` works without any), ``max_deliveries``, watermarks, ``max_held``
    (leases one consumer holds at once; ``None``: no bound, as in the
    implementation), ``sample_bytes`` (every sample's size, except
    ``large_samples``, which are ``large_bytes``; the step API may override a
    size per sample in ``store_put``), ``max_faults`` (how many store calls may
    fail in one behaviour; ``None``: no bound, for the step API),
    ``dedup_window`` (settled ids remembered; ``None``: all of them, the spec's
    default ``Cardinality(Samples)``), ``keep_dead`` (``KeepDead``: a dead
    letter's bytes stay retained for a requeue), ``max_samples`` (``MaxSamples``,
    the store's sample-count cap; ``None``: the spec's default, never reached),
    ``untrainable`` (``Untrainable``: samples the loader's schema refuses, which
    a consumer rejects and never acks), ``max_losses`` (``MaxLosses``), ``max_give_backs`` (``MaxGiveBacks``:
    give-backs ``Next`` allows in one behaviour; the step API's ``give_back`` is not bounded), ``bugs`` (see
    ``BUGS``).
    """

    samples: tuple[str, ...] = ("s1", "s2")
    consumers: tuple[str, ...] = ("c1", "c2")
    max_deliveries: int = 2
    high_watermark: int = 2
    low_watermark: int = 1
    max_held: int | None = 1
    sample_bytes: int = 1
    bugs: frozenset[str] = frozenset()
    producers: tuple[str, ...] = ()
    large_samples: frozenset[str] = frozenset()
    large_bytes: int | None = None
    max_faults: int | None = None
    dedup_window: int | None = None
    keep_dead: bool = False
    max_samples: int | None = None
    max_losses: int = 0
    untrainable: frozenset[str] = frozenset()
    max_give_backs: int = 0

    def __post_init__(self) -> None:
        for name in ("samples", "consumers", "producers"):
            values = getattr(self, name)
            if (not values and name != "producers") or len(set(values)) != len(values):
                raise ValueError(f"{name} must be non-empty distinct non-empty strings, got {values!r}")
            if not all(isinstance(v, str) and v for v in values):
                raise ValueError(f"{name} must be non-empty distinct non-empty strings, got {values!r}")
        if isinstance(self.max_deliveries, bool) or not isinstance(self.max_deliveries, int) or self.max_deliveries < 1:
            raise ValueError(f"max_deliveries must be an int >= 1, got {self.max_deliveries!r}")
        if not 0 <= self.low_watermark < self.high_watermark:
            raise ValueError(
                f"watermarks need 0 <= low < high, got low={self.low_watermark!r} high={self.high_watermark!r}"
            )
        if self.max_held is not None and self.max_held < 1:
            raise ValueError(f"max_held must be >= 1 or None, got {self.max_held!r}")
        if self.sample_bytes < 1 or (self.large_bytes is not None and self.large_bytes < 1):
            raise ValueError(f"sizes must be >= 1, got {self.sample_bytes!r} and {self.large_bytes!r}")
        for name in ("large_samples", "untrainable"):
            if not set(getattr(self, name)) <= set(self.samples):
                raise ValueError(f"{name} {sorted(getattr(self, name))} must be among samples {self.samples}")
        if self.max_faults is not None and self.max_faults < 0:
            raise ValueError(f"max_faults must be >= 0 or None, got {self.max_faults!r}")
        if self.max_samples is not None and self.max_samples < 1:
            raise ValueError(f"max_samples must be >= 1 or None, got {self.max_samples!r}")
        if self.max_losses < 0:
            raise ValueError(f"max_losses must be >= 0, got {self.max_losses!r}")
        if self.max_give_backs < 0:
            raise ValueError(f"max_give_backs must be >= 0, got {self.max_give_backs!r}")
        if self.dedup_window is not None and self.dedup_window < 1:
            raise ValueError(f"dedup_window must be >= 1 or None, got {self.dedup_window!r}")
        unknown = set(self.bugs) - set(BUGS)
        if unknown:
            raise ValueError(f"unknown bugs {sorted(unknown)!r}; known: {sorted(BUGS)}")

    def sizes(self) -> tuple[int, ...]:
        """``SampleSize`` of each sample, by index."""
        large = self.large_bytes if self.large_bytes is not None else self.sample_bytes
        return tuple(large if s in self.large_samples else self.sample_bytes for s in self.samples)

    @property
    def window(self) -> int:
        """``DedupWindow``."""
        return len(self.samples) if self.dedup_window is None else self.dedup_window


class SpecState(NamedTuple):
    """The spec's VARIABLES; samples, consumers and producers are indices into the constants' tuples."""

    status: tuple[str, ...]  # status[s]
    queue: tuple[int, ...]  # queue: the pending FIFO, head first
    deliveries: tuple[int, ...]  # deliveries[s]: redelivery_count of s's current lease
    lease: tuple[tuple[str, ...], ...]  # lease[s][k]: state of delivery attempt k of s
    held: tuple[frozenset[tuple[int, int]], ...]  # held[c]: lease tokens consumer c holds
    handles: tuple[frozenset[int], ...]  # handles[c]: samples consumer c has a store handle on
    hcount: tuple[int, ...]  # hcount[s]: handles the store counts for s
    resident: frozenset[int]  # resident: samples whose bytes the store holds
    retained: frozenset[int]  # retained: samples a queue holds (retain ... scrub / unretain)
    resident_bytes: int  # residentBytes: the store's byte counter
    backpressure: str  # bp: "flowing" | "paused"
    lifecycle: str  # lifecycle: "open" | "draining" | "drained"
    window: tuple[int, ...] = ()  # window: the dedup window, oldest first
    backlog: frozenset[int] = frozenset()  # backlog: samples whose scrub (unretain) failed, being retried
    faults: int = 0  # faults: store faults so far
    pc: tuple[str, ...] = ()  # pc[p]: "idle" | "waiting" | "aborted"
    owns: tuple[int, ...] = ()  # owns[p]: the sample producer p stored and holds (NO_SAMPLE: none)
    kept: frozenset[int] = frozenset()  # kept: dead letters whose bytes stay retained for a requeue
    lost: frozenset[int] = frozenset()  # lost: samples whose bytes the store lost (StoreLoses)
    given_back: int = 0  # givenBack: unused leases given back so far (GiveBackStep)


Event = tuple[str, int, str]  # (action, sample index or -1, store call or "")


class _Step(NamedTuple):
    state: SpecState
    events: tuple[Event, ...]  # implementation-style trace events
    token: tuple[int, int] | None = None


def initial_state(k: SpecConstants) -> SpecState:
    """``Init``."""
    n, m, q = len(k.samples), len(k.consumers), len(k.producers)
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
        window=(),
        backlog=frozenset(),
        faults=0,
        pc=("idle",) * q,
        owns=(NO_SAMPLE,) * q,
    )


def _set(values: tuple, index: int, value: object) -> tuple:
    return (*values[:index], value, *values[index + 1 :])


def _fire(st: SpecState, action: str, s: int, attempt: int) -> tuple[tuple[str, ...], ...]:
    """``Fired``: move lease attempt ``attempt`` of ``s`` along ``action``'s edge of ``LeaseTransitions``."""
    for name, source, dest in LEASE_TRANSITIONS:
        if name == action:
            assert st.lease[s][attempt] == source, (action, st.lease[s][attempt])
            return _set(st.lease, s, _set(st.lease[s], attempt, dest))
    raise KeyError(action)


def _queue_empty(st: SpecState) -> bool:
    """``QueueEmpty``: nothing pending or leased."""
    return not any(x in HELD_BY_QUEUE for x in st.status)


def _known_settled(st: SpecState, s: int) -> bool:
    """``KnownSettled``: in the dedup window, its scrub being retried, or a dead letter whose bytes are kept."""
    return s in st.window or s in st.backlog or s in st.kept


def _fault_ok(k: SpecConstants, st: SpecState) -> bool:
    """``Fault`` is enabled: a store call may still fail."""
    return k.max_faults is None or st.faults < k.max_faults


def _free(st: SpecState, s: int, sizes: tuple[int, ...]) -> SpecState:
    """``Free``: the store drops ``s``'s bytes and its bookkeeping (``_forget``)."""
    return st._replace(
        resident=st.resident - {s},
        retained=st.retained - {s},
        hcount=_set(st.hcount, s, 0),
        resident_bytes=st.resident_bytes - (sizes[s] if s in st.resident else 0),
    )


def _scrub(k: SpecConstants, st: SpecState, s: int, sizes: tuple[int, ...]) -> SpecState:
    """``Scrub``: free a settled sample whatever handles are out (BugNoScrub: only un-retain while handles exist)."""
    if "B" in k.bugs and st.hcount[s] > 0:
        return st._replace(retained=st.retained - {s})
    return _free(st, s, sizes)


def _remember(k: SpecConstants, st: SpecState, s: int) -> tuple[int, ...]:
    """``Remember``: append ``s`` to the dedup window, evicting the oldest past ``DedupWindow``."""
    window = (*st.window, s)
    return window[1:] if len(window) > k.window else window


def _scrub_or_owe(
    k: SpecConstants, st: SpecState, s: int, fault: bool, sizes: tuple[int, ...]
) -> tuple[SpecState, tuple[Event, ...]] | None:
    """``ScrubOrOwe``: the store scrubs ``s``, or (``fault``) the scrub fails and ``s`` joins the backlog."""
    if not fault:
        return _scrub(k, st, s, sizes), ()
    if not _fault_ok(k, st):
        return None
    return st._replace(faults=st.faults + 1, backlog=st.backlog | {s}), ((STORE_FAULT, s, "scrub"),)


def _retire(
    k: SpecConstants, st: SpecState, s: int, outcome: str, fault: bool, sizes: tuple[int, ...]
) -> tuple[SpecState, tuple[Event, ...]] | None:
    """``Retire``: ``s`` settles as ``outcome``; the store scrubs it, or (``fault``) the scrub joins the backlog.

    ``KeepDead``: a dead letter is not scrubbed (no store call), its bytes stay retained (``kept``).
    """
    st = st._replace(status=_set(st.status, s, outcome))
    if outcome == "dead" and k.keep_dead:
        return None if fault else (st._replace(window=_remember(k, st, s), kept=st.kept | {s}), ())
    if fault and "S" in k.bugs and outcome == "acked":
        return (st._replace(faults=st.faults + 1), ((STORE_FAULT, s, "scrub"),)) if _fault_ok(k, st) else None
    return _scrub_or_owe(k, st._replace(window=_remember(k, st, s)), s, fault, sizes)


def _dead_letter(
    k: SpecConstants, st: SpecState, s: int, fault: bool, sizes: tuple[int, ...]
) -> tuple[SpecState, tuple[Event, ...]] | None:
    """``DeadLetter``: ``s`` is dead-lettered (its bytes scrubbed, owed or kept)."""
    retired = _retire(k, st, s, "dead", fault, sizes)
    if retired is None:
        return None
    return retired[0], ((DEAD_LETTER, s, ""), *retired[1])


def _redeliver(
    k: SpecConstants, st: SpecState, s: int, fault: bool, sizes: tuple[int, ...]
) -> tuple[SpecState, tuple[Event, ...]] | None:
    """``Redeliver``: to the tail as a new lease, or dead once ``MaxDeliveries`` deliveries are spent."""
    nxt = st.deliveries[s] + 1
    if nxt >= k.max_deliveries and "D" not in k.bugs:
        return _dead_letter(k, st, s, fault, sizes)
    if fault:
        return None
    return (
        st._replace(
            status=_set(st.status, s, "pending"),
            deliveries=_set(st.deliveries, s, nxt),
            lease=_set(st.lease, s, _set(st.lease[s], nxt, "pending")),
            queue=(*st.queue, s),
        ),
        (),
    )


def _drain_if_idle(st: SpecState) -> tuple[SpecState, tuple[Event, ...]]:
    """``DrainIfIdle``: ``_maybe_drained`` at the end of close and of every settle."""
    if st.lifecycle == "draining" and _queue_empty(st):
        return st._replace(lifecycle="drained"), ((DRAIN, -1, ""),)
    return st, ()


# -- the queue's actions (each mirrors the TLA+ action of the same name) ---------------------------------
# Each returns None when disabled, else the successor state and the implementation trace events.


def a_store_put(k: SpecConstants, st: SpecState, s: int, sizes: tuple[int, ...]) -> _Step | None:
    """StorePut(s): ``FeatureStore.put`` without a producer process (trace validation's single step)."""
    if st.status[s] != "absent":
        return None
    return _Step(
        st._replace(
            status=_set(st.status, s, "stored"),
            resident=st.resident | {s},
            resident_bytes=st.resident_bytes + sizes[s],
        ),
        (),
    )


def a_put(k: SpecConstants, st: SpecState, s: int) -> _Step | None:
    """PutCore(s) / Put(s): ``SampleRefQueue.put`` -- enqueue a stored sample at the tail; the store retains it."""
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
        ((PUT, s, ""),),
    )


def _pending_anew(k: SpecConstants, st: SpecState, s: int) -> SpecState:
    """A settled ``s`` back at the pending tail as a new incarnation: no delivery spent, a fresh lease history."""
    fresh = (NO_LEASE,) * (k.max_deliveries + 1)
    return st._replace(
        status=_set(st.status, s, "pending"),
        deliveries=_set(st.deliveries, s, 0),
        lease=_set(st.lease, s, _set(fresh, 0, "pending")),
        queue=(*st.queue, s),
    )


def a_reput(k: SpecConstants, st: SpecState, s: int, sizes: tuple[int, ...]) -> _Step | None:
    """Reput(s): ``put`` of a settled id the queue still knows -- refused by dedup (bugs: accepted again)."""
    if st.status[s] not in TERMINAL or st.lifecycle != "open":
        return None
    if _known_settled(st, s) and "C" not in k.bugs:
        return _Step(st, ((DEDUP_REFUSED, s, ""),))
    if "C" not in k.bugs and s not in st.resident:
        return None
    requeued = _pending_anew(k, st, s)._replace(
        resident=st.resident | {s},
        retained=st.retained | {s},
        resident_bytes=st.resident_bytes + (0 if s in st.resident else sizes[s]),
    )
    return _Step(requeued, ((PUT, s, ""),))


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
            lease=_fire(st, ACQUIRE, s, attempt),
            held=_set(st.held, c, st.held[c] | {token}),
        ),
        ((ACQUIRE, s, ""),),
        token,
    )


def _is_live(st: SpecState, token: tuple[int, int]) -> bool:
    s, attempt = token
    return st.lease[s][attempt] == "leased"


def _settled(trigger: str, s: int, settled: tuple[SpecState, tuple[Event, ...]] | None, drain: bool) -> _Step | None:
    """The step of a lease of ``s`` settled by ``trigger`` with the outcome ``settled`` (``None``: the step is not
    enabled), then ``DrainIfIdle`` when ``drain``."""
    if settled is None:
        return None
    st, events = settled
    drained, more = _drain_if_idle(st) if drain else (st, ())
    return _Step(drained, ((trigger, s, ""), *events, *more))


def a_settle(
    k: SpecConstants,
    st: SpecState,
    c: int,
    token: tuple[int, int],
    sizes: tuple[int, ...],
    trigger: str,
    fault: bool = False,
    drain: bool = True,
) -> _Step | None:
    """AckStep / FailStep(c, l, fault) (``drain``), Ack / Fail(c, l): ``ack`` or ``fail`` (``trigger``) -- settle
    the live lease (ack retires it; fail redelivers or dead-letters it) or reject a stale one."""
    if token not in st.held[c] or token[0] in st.lost:  # a lost sample's get raises: it is reported (a_lose)
        return None
    if trigger == ACK and k.samples[token[0]] in k.untrainable:  # the loader refuses it first (a_reject)
        return None
    st = st._replace(held=_set(st.held, c, st.held[c] - {token}))
    if not _is_live(st, token):
        return None if fault else _Step(st, ((STALE_REJECTED, token[0], ""),))
    s, attempt = token
    st = st._replace(lease=_fire(st, trigger, s, attempt))
    outcome = _retire(k, st, s, "acked", fault, sizes) if trigger == ACK else _redeliver(k, st, s, fault, sizes)
    return _settled(trigger, s, outcome, drain)


def a_store_loses(k: SpecConstants, st: SpecState, s: int, sizes: tuple[int, ...]) -> _Step | None:
    """StoreLoses(s): the store loses a queued sample's bytes (its segment's owner died, its server restarted)."""
    if (
        len(st.lost) >= k.max_losses
        or s not in st.resident
        or st.status[s] not in HELD_BY_QUEUE
        or any(s in handles for handles in st.handles)
    ):
        return None
    return _Step(_free(st._replace(lost=st.lost | {s}), s, sizes), ())


def a_lose(k: SpecConstants, st: SpecState, c: int, token: tuple[int, int], drain: bool = True) -> _Step | None:
    """LoseStep(c, l): ``lose`` -- the consumer found the bytes lost: dead-letter the live lease at once.

    BugLostRedelivered: it fails the lease instead, and the queue redelivers it.
    """
    s, attempt = token
    if token not in st.held[c] or s not in st.lost:
        return None
    st = st._replace(held=_set(st.held, c, st.held[c] - {token}))
    if not _is_live(st, token):
        return _Step(st, ((STALE_REJECTED, s, ""),))
    st = st._replace(lease=_fire(st, FAIL, s, attempt))
    if "L" in k.bugs:
        redelivered = _redeliver(k, st, s, False, k.sizes())
        assert redelivered is not None
        st, events = redelivered
    else:
        st = st._replace(status=_set(st.status, s, "dead"), window=_remember(k, st, s))
        events = ((DEAD_LETTER, s, ""),)
    return _settled(FAIL, s, (st, events), drain)


def a_reject(
    k: SpecConstants,
    st: SpecState,
    c: int,
    token: tuple[int, int],
    sizes: tuple[int, ...],
    fault: bool = False,
    drain: bool = True,
) -> _Step | None:
    """RejectStep(c, l, fault) (``drain``), Reject(c, l): ``reject`` -- the loader's schema refuses an untrainable
    sample: dead-letter the live lease at once, whatever deliveries are left, or reject a stale one.

    BugUntrainedAcked: it acks the lease instead.
    """
    s, attempt = token
    if token not in st.held[c] or k.samples[s] not in k.untrainable:
        return None
    st = st._replace(held=_set(st.held, c, st.held[c] - {token}))
    if not _is_live(st, token):
        return None if fault else _Step(st, ((STALE_REJECTED, s, ""),))
    if "U" in k.bugs:
        st = st._replace(lease=_fire(st, ACK, s, attempt))
        return _settled(ACK, s, _retire(k, st, s, "acked", fault, sizes), drain)
    st = st._replace(lease=_fire(st, FAIL, s, attempt))
    return _settled(FAIL, s, _dead_letter(k, st, s, fault, sizes), drain)


def a_give_back(k: SpecConstants, st: SpecState, c: int, token: tuple[int, int], bounded: bool = True) -> _Step | None:
    """GiveBackStep(c, l) (``bounded``: at most ``MaxGiveBacks`` per behaviour, counted), GiveBack(c, l):
    ``give_back`` -- an unused live lease goes back to the pending tail, its redelivery count unchanged; a stale
    one is rejected."""
    if token not in st.held[c] or (bounded and st.given_back >= k.max_give_backs):
        return None
    st = st._replace(held=_set(st.held, c, st.held[c] - {token}))
    if bounded:
        st = st._replace(given_back=st.given_back + 1)
    s, attempt = token
    if not _is_live(st, token):
        return _Step(st, ((STALE_REJECTED, s, ""),))
    back = st._replace(
        lease=_fire(st, GIVE_BACK, s, attempt), status=_set(st.status, s, "pending"), queue=(*st.queue, s)
    )
    return _Step(back, ((GIVE_BACK, s, ""),))


def a_extend(k: SpecConstants, st: SpecState, c: int, token: tuple[int, int]) -> _Step | None:
    """Extend(c, l): ``extend`` -- push a live lease's deadline (``LeaseLost`` for a stale one).

    Time is abstract (``Reclaim`` may take any live lease), so a granted
    extension changes no variable: it is a stuttering step of the spec.
    """
    if token not in st.held[c]:
        return None
    if not _is_live(st, token):
        return _Step(st, ((STALE_REJECTED, token[0], ""),))
    _fire(st, EXTEND, *token)
    return _Step(st, ((EXTEND, token[0], ""),))


def a_reclaim(
    k: SpecConstants, st: SpecState, s: int, sizes: tuple[int, ...], fault: bool = False, drain: bool = True
) -> _Step | None:
    """ReclaimStep(s, fault) / Reclaim(s): the reaper takes back an expired live lease (BugNoReaper: never).

    Time is abstract: any live lease may have passed its deadline, so the
    clock advancing and the reaper running are one step.
    """
    if st.status[s] != "leased" or "E" in k.bugs:
        return None
    redelivered = _redeliver(k, st._replace(lease=_fire(st, RECLAIM, s, st.deliveries[s])), s, fault, sizes)
    return _settled(RECLAIM, s, redelivered, drain)


def a_get(k: SpecConstants, st: SpecState, c: int, s: int) -> _Step | None:
    """Get(c, s): ``FeatureStore.get`` by a consumer holding a (possibly stale) lease of ``s``."""
    if s not in st.resident or s in st.handles[c] or not any(t[0] == s for t in st.held[c]):
        return None
    return _Step(
        st._replace(handles=_set(st.handles, c, st.handles[c] | {s}), hcount=_set(st.hcount, s, st.hcount[s] + 1)),
        (),
    )


def a_release(k: SpecConstants, st: SpecState, c: int, s: int, sizes: tuple[int, ...]) -> _Step | None:
    """Release(c, s): ``FeatureStore.release`` -- frees an unretained sample on its last handle.

    BugStaleRelease: the last release frees the sample even while a queue retains it.
    """
    if s not in st.handles[c]:
        return None
    st = st._replace(handles=_set(st.handles, c, st.handles[c] - {s}))
    if s not in st.resident or st.hcount[s] == 0:  # a scrubbed sample's handle: releasing it is a no-op
        return _Step(st, ())
    if st.hcount[s] == 1 and (s not in st.retained or "A" in k.bugs):
        return _Step(_free(st, s, sizes), ())
    return _Step(st._replace(hcount=_set(st.hcount, s, st.hcount[s] - 1)), ())


def a_crash(k: SpecConstants, st: SpecState, c: int) -> _Step | None:
    """Crash(c): the consumer process dies, forgetting its leases and handles (the store still counts them)."""
    if not st.held[c] and not st.handles[c]:
        return None
    return _Step(st._replace(held=_set(st.held, c, frozenset()), handles=_set(st.handles, c, frozenset())), ())


def _at_sample_cap(k: SpecConstants, st: SpecState) -> bool:
    """``AtSampleCap``: the store holds as many samples as its count cap allows (``BugOnlyBytes`` ignores it)."""
    return k.max_samples is not None and "O" not in k.bugs and len(st.resident) >= k.max_samples


def a_pause(k: SpecConstants, st: SpecState) -> _Step | None:
    """Pause: ``_update_backpressure`` sees resident bytes at/above the high watermark, or the count cap."""
    if st.backpressure != "flowing" or (st.resident_bytes < k.high_watermark and not _at_sample_cap(k, st)):
        return None
    return _Step(st._replace(backpressure="paused"), ((PAUSE, -1, ""),))


def a_resume(k: SpecConstants, st: SpecState) -> _Step | None:
    """Resume: ``_update_backpressure`` sees resident bytes at/below the low watermark, below the count cap."""
    if st.backpressure != "paused" or st.resident_bytes > k.low_watermark or _at_sample_cap(k, st):
        return None
    return _Step(st._replace(backpressure="flowing"), ((RESUME, -1, ""),))


def a_close(k: SpecConstants, st: SpecState, drain: bool = True) -> _Step | None:
    """CloseStep / Close: ``close`` -- refuse further puts, wake producers; drained at once when holding nothing."""
    if st.lifecycle != "open":
        return None
    st = st._replace(lifecycle="draining")
    drained, more = _drain_if_idle(st) if drain else (st, ())
    return _Step(drained, ((CLOSE, -1, ""), *more))


def a_drain(k: SpecConstants, st: SpecState) -> _Step | None:
    """Drain: the closed queue holds nothing pending or leased (trace validation's single step)."""
    drained, events = _drain_if_idle(st)
    return _Step(drained, events) if events else None


def a_retry_scrub(k: SpecConstants, st: SpecState, s: int, sizes: tuple[int, ...], fault: bool = False) -> _Step | None:
    """RetryScrub(s, fault): a later operation (or ``gc``) retries the failed scrub / unretain of ``s``."""
    if s not in st.backlog:
        return None
    call = "scrub" if st.status[s] in TERMINAL | {"discarded"} else "unretain"
    if fault:
        if not _fault_ok(k, st):
            return None
        return _Step(st._replace(faults=st.faults + 1), ((STORE_FAULT, s, call),))
    st = st._replace(backlog=st.backlog - {s})
    if call == "scrub":
        st = _free(st, s, sizes)
    else:
        st = st._replace(retained=st.retained - {s})
    return _Step(st, ((SCRUB_RETRIED, s, call),))


def _requeueable(k: SpecConstants, st: SpecState, s: int) -> bool:
    """``Requeueable``: a dead letter whose bytes are kept (BugRequeueAnySettled: any settled id)."""
    return st.status[s] in TERMINAL if "R" in k.bugs else s in st.kept


def a_requeue_dead_letter(k: SpecConstants, st: SpecState, s: int, bounded: bool = True) -> _Step | None:
    """RequeueStep(s) (``bounded``) / RequeueDeadLetter(s): ``requeue_dead_letters`` -- a kept dead letter goes
    back to the pending tail with a fresh delivery budget and lease history, out of the window and of ``kept``.

    ``bounded`` adds Next's model bounds: the queue is open, the store counts no handle of ``s``, and no
    consumer holds a lease of the old incarnation.
    """
    if not _requeueable(k, st, s) or st.lifecycle == "drained":
        return None
    if bounded and (st.lifecycle != "open" or st.hcount[s] or any(t[0] == s for held in st.held for t in held)):
        return None
    requeued = _pending_anew(k, st, s)._replace(window=tuple(x for x in st.window if x != s), kept=st.kept - {s})
    return _Step(requeued, ((REQUEUE_DEAD_LETTER, s, ""),))


def a_purge_dead_letter(
    k: SpecConstants, st: SpecState, s: int, sizes: tuple[int, ...], fault: bool = False
) -> _Step | None:
    """PurgeDeadLetter(s, fault): ``purge_dead_letters`` -- a kept dead letter dropped, its bytes scrubbed
    (a failing scrub is owed, as after an ack); the id stays in the dedup window."""
    if s not in st.kept:
        return None
    scrubbed = _scrub_or_owe(k, st._replace(kept=st.kept - {s}), s, fault, sizes)
    if scrubbed is None:
        return None
    return _Step(scrubbed[0], ((PURGE_DEAD_LETTER, s, ""), *scrubbed[1]))


# -- producers ------------------------------------------------------------------------------------------


def _may_enqueue(k: SpecConstants, st: SpecState) -> bool:
    """``MayEnqueue``: once the hysteresis settled, flowing below the high watermark, or (the fix) paused
    with nothing pending or leased."""
    capped = _at_sample_cap(k, st)
    if st.backpressure == "flowing":
        return st.resident_bytes < k.high_watermark and not capped
    return (st.resident_bytes > k.low_watermark or capped) and "P" not in k.bugs and _queue_empty(st)


def _storable(st: SpecState, s: int) -> bool:
    """``Storable``: a fresh id, or a settled one the queue forgot whose bytes are gone (no old lease/handle out)."""
    if st.status[s] == "absent":
        return True
    return (
        st.status[s] in TERMINAL
        and not _known_settled(st, s)
        and s not in st.resident
        and all(s not in h for h in st.handles)
        and all(t[0] != s for held in st.held for t in held)
    )


def a_producer_store(k: SpecConstants, st: SpecState, p: int, s: int, sizes: tuple[int, ...]) -> _Step | None:
    """ProducerStore(p, s): ``FeatureStore.put``, then the producer enters ``put_blocks_until_below``; a store
    at its count cap refuses the put."""
    if st.pc[p] != "idle" or st.lifecycle != "open" or not _storable(st, s):
        return None
    if k.max_samples is not None and len(st.resident) >= k.max_samples:
        return None
    return _Step(
        st._replace(
            status=_set(st.status, s, "stored"),
            deliveries=_set(st.deliveries, s, 0),
            lease=_set(st.lease, s, (NO_LEASE,) * (k.max_deliveries + 1)),
            resident=st.resident | {s},
            resident_bytes=st.resident_bytes + sizes[s],
            pc=_set(st.pc, p, "waiting"),
            owns=_set(st.owns, p, s),
            lost=st.lost - {s},  # a new incarnation: bytes of its own
        ),
        (),
    )


def _waiting(st: SpecState, p: int) -> bool:
    return st.pc[p] == "waiting" and st.lifecycle == "open"


def a_pause_p(k: SpecConstants, st: SpecState, p: int) -> _Step | None:
    """PauseP(p): the hysteresis step of a waiting producer's round pauses."""
    return a_pause(k, st) if _waiting(st, p) else None


def a_resume_p(k: SpecConstants, st: SpecState, p: int) -> _Step | None:
    """ResumeP(p): the hysteresis step of a waiting producer's round resumes."""
    return a_resume(k, st) if _waiting(st, p) else None


def a_enqueue(k: SpecConstants, st: SpecState, p: int) -> _Step | None:
    """Enqueue(p): the round ends in the enqueue (retain succeeded)."""
    if not _waiting(st, p) or not _may_enqueue(k, st):
        return None
    step = a_put(k, st, st.owns[p])
    if step is None:
        return None
    return _Step(step.state._replace(pc=_set(st.pc, p, "idle"), owns=_set(st.owns, p, NO_SAMPLE)), step.events)


def _raise(st: SpecState, p: int) -> SpecState:
    return st._replace(pc=_set(st.pc, p, "aborted"))


def a_retain_fails(k: SpecConstants, st: SpecState, p: int) -> _Step | None:
    """RetainFails(p): ``retain`` fails, the put is refused and raises; queue and store unchanged."""
    if not _waiting(st, p) or not _may_enqueue(k, st) or not _fault_ok(k, st):
        return None
    return _Step(_raise(st, p)._replace(faults=st.faults + 1), ((STORE_FAULT, st.owns[p], "retain"),))


def a_health_fails(k: SpecConstants, st: SpecState, p: int) -> _Step | None:
    """HealthFails(p): ``health()`` fails, the put raises (the producer discards)."""
    if not _waiting(st, p) or not _fault_ok(k, st):
        return None
    return _Step(_raise(st, p)._replace(faults=st.faults + 1), ((STORE_FAULT, st.owns[p], "health"),))


def a_abort(k: SpecConstants, st: SpecState, p: int) -> _Step | None:
    """Abort(p): ``abort_when()`` returned True."""
    if st.pc[p] != "waiting":
        return None
    return _Step(_raise(st, p), ())


def a_closed_raise(k: SpecConstants, st: SpecState, p: int, fault: bool = False) -> _Step | None:
    """ClosedRaise(p, fault): close woke the waiting producer and its put raised (``unretain`` may fail)."""
    if st.pc[p] != "waiting" or st.lifecycle == "open":
        return None
    if not fault:
        return _Step(_raise(st, p), ())
    if not _fault_ok(k, st):
        return None
    s = st.owns[p]
    return _Step(
        _raise(st, p)._replace(faults=st.faults + 1, retained=st.retained | {s}, backlog=st.backlog | {s}),
        ((STORE_FAULT, s, "unretain"),),
    )


def a_discard(k: SpecConstants, st: SpecState, p: int, sizes: tuple[int, ...]) -> _Step | None:
    """Discard(p): the producer evicts the sample whose put raised (its bytes go at once, owed unretain or not)."""
    if st.pc[p] != "aborted":
        return None
    s = st.owns[p]
    st = st._replace(
        status=_set(st.status, s, "discarded"), pc=_set(st.pc, p, "idle"), owns=_set(st.owns, p, NO_SAMPLE)
    )
    return _Step(_free(st, s, sizes), ())


def _finished(st: SpecState) -> bool:
    """``Finished``: drained, backlog empty, every producer idle (``Done`` is enabled)."""
    return st.lifecycle == "drained" and not st.backlog and all(x == "idle" for x in st.pc)


def labelled_successors(k: SpecConstants, st: SpecState) -> Iterator[tuple[str, _Step]]:
    """``Next``: every step enabled in ``st``, labelled with its action's name (stuttering steps included)."""
    sizes = k.sizes()
    n, m, q = len(k.samples), len(k.consumers), len(k.producers)
    for p in range(q):
        for s in range(n):
            yield "ProducerStore", a_producer_store(k, st, p, s, sizes)  # type: ignore[misc]
        yield "PauseP", a_pause_p(k, st, p)  # type: ignore[misc]
        yield "ResumeP", a_resume_p(k, st, p)  # type: ignore[misc]
        yield "Enqueue", a_enqueue(k, st, p)  # type: ignore[misc]
        yield "RetainFails", a_retain_fails(k, st, p)  # type: ignore[misc]
        yield "HealthFails", a_health_fails(k, st, p)  # type: ignore[misc]
        yield "Abort", a_abort(k, st, p)  # type: ignore[misc]
        for fault in (False, True):
            yield "ClosedRaise", a_closed_raise(k, st, p, fault)  # type: ignore[misc]
        yield "Discard", a_discard(k, st, p, sizes)  # type: ignore[misc]
    for s in range(n):
        yield "Reput", a_reput(k, st, s, sizes)  # type: ignore[misc]
        for fault in (False, True):
            yield RECLAIM, a_reclaim(k, st, s, sizes, fault)  # type: ignore[misc]
            yield "RetryScrub", a_retry_scrub(k, st, s, sizes, fault)  # type: ignore[misc]
            yield PURGE_DEAD_LETTER, a_purge_dead_letter(k, st, s, sizes, fault)  # type: ignore[misc]
        yield REQUEUE_DEAD_LETTER, a_requeue_dead_letter(k, st, s)  # type: ignore[misc]
        yield "StoreLoses", a_store_loses(k, st, s, sizes)  # type: ignore[misc]
    for c in range(m):
        yield ACQUIRE, a_acquire(k, st, c)  # type: ignore[misc]
        yield "Crash", a_crash(k, st, c)  # type: ignore[misc]
        for token in st.held[c]:
            yield EXTEND, a_extend(k, st, c, token)  # type: ignore[misc]
            yield "Lose", a_lose(k, st, c, token)  # type: ignore[misc]
            yield GIVE_BACK, a_give_back(k, st, c, token)  # type: ignore[misc]
            for fault in (False, True):
                yield "Reject", a_reject(k, st, c, token, sizes, fault)  # type: ignore[misc]
                for trigger in (ACK, FAIL):
                    yield trigger, a_settle(k, st, c, token, sizes, trigger, fault)  # type: ignore[misc]
        for s in range(n):
            yield "Get", a_get(k, st, c, s)  # type: ignore[misc]
            yield "Release", a_release(k, st, c, s, sizes)  # type: ignore[misc]
    yield CLOSE, a_close(k, st)  # type: ignore[misc]
    if _finished(st):
        yield "Done", _Step(st, ())


def successors(k: SpecConstants, st: SpecState) -> Iterator[SpecState]:
    """``Next``: every state one action away from ``st`` (stuttering steps included)."""
    for _, step in labelled_successors(k, st):
        if step is not None:
            yield step.state


def reachable_states(constants: SpecConstants, limit: int | None = None, *, check: bool = False) -> int:
    """Breadth-first count of the distinct states reachable from ``Init`` (TLC's "distinct states").

    With ``check``, every state invariant and action property is asserted on
    the way, as TLC does (``AssertionError`` naming the first one broken), and
    so is deadlock freedom (``Deadlock:``: a state with no enabled step).
    Raises ``RuntimeError`` past ``limit`` states, so a runaway model fails fast.
    """
    if constants.max_faults is None:
        raise ValueError("reachable_states needs a bounded model: set max_faults")
    start = initial_state(constants)
    seen = {start}
    frontier = deque([start])
    if check:
        check_state(constants, start)
    while frontier:
        st = frontier.popleft()
        enabled = False
        for nxt in successors(constants, st):
            enabled = True
            if check:
                check_step(constants, st, nxt)
                check_state(constants, nxt)
            if nxt not in seen:
                seen.add(nxt)
                if limit is not None and len(seen) > limit:
                    raise RuntimeError(f"more than {limit} reachable states for {constants!r}")
                frontier.append(nxt)
        if check and not enabled:
            raise AssertionError(f"Deadlock: no action is enabled in {st!r}")
    return len(seen)


# -- invariants (same names as the TLA+ definitions) --------------------------------------------------------


def check_state(k: SpecConstants, st: SpecState, sizes: Mapping[int, int] | None = None, *, bound: bool = True) -> None:
    """Assert every state invariant of the spec; the message starts with the invariant's TLA+ name.

    ``sizes`` overrides sample sizes by index; ``bound=False`` skips
    ``ResidencyBound`` and ``SampleCapRoom`` (for runs that enqueue outside the producer path).
    """
    n = len(k.samples)
    base = k.sizes()

    def size(s: int) -> int:
        return sizes.get(s, base[s]) if sizes else base[s]

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
            assert s in st.resident or s in st.lost, (
                f"NoLoss: sample {name(s)!r} is {st.status[s]} but not resident in the store (nor lost by it)"
            )
        if st.status[s] in TERMINAL | {"discarded"} and s not in st.backlog and s not in st.kept:
            assert s not in st.resident, f"NoLeak: sample {name(s)!r} is {st.status[s]} but still resident"
        assert st.deliveries[s] < k.max_deliveries, (
            f"BoundedDelivery: sample {name(s)!r} redelivery_count {st.deliveries[s]} >= MaxDeliveries "
            f"{k.max_deliveries}"
        )
        assert st.status[s] != "acked" or name(s) not in k.untrainable, (
            f"AckedWasTrained: sample {name(s)!r}, which no consumer can train, was acked"
        )
        if st.status[s] in TERMINAL and s in st.resident:
            assert _known_settled(st, s), (
                f"SettledKnown: settled sample {name(s)!r} is resident but neither in the dedup window nor the backlog"
            )
    total = sum(size(s) for s in st.resident)
    assert st.resident_bytes == total and st.resident_bytes >= 0 and all(h >= 0 for h in st.hcount), (
        f"ResidencyExact: residentBytes {st.resident_bytes} but resident samples sum to {total}"
    )
    if st.lifecycle == "drained":
        busy = [name(s) for s in range(n) if st.status[s] in HELD_BY_QUEUE]
        assert not busy, f"CloseDrain: drained while {busy} are pending or leased"
    if bound:
        queue_bound = max(k.high_watermark - 1, max(size(s) for s in range(n)))
        queued = sum(size(s) for s in range(n) if st.status[s] in HELD_BY_QUEUE and s not in st.lost)
        stored = [s for s in range(n) if st.status[s] == "stored"]
        unqueued = sum(size(s) for s in stored)
        backlog = sum(size(s) for s in st.backlog)
        kept = sum(size(s) for s in st.kept)
        # KeepDead: a requeue bypasses backpressure, so only the accounting holds (spec: ResidencyBound).
        assert k.keep_dead or queued <= queue_bound, f"ResidencyBound: the queue holds {queued} B > {queue_bound} B"
        base_bound = queued if k.keep_dead else queue_bound
        assert st.resident_bytes <= base_bound + unqueued + backlog + kept, (
            f"ResidencyBound: {st.resident_bytes} B resident > {base_bound} + {unqueued} (producers) "
            f"+ {backlog} (backlog) + {kept} (kept)"
        )
        assert len(stored) <= len(k.producers), (
            f"ResidencyBound: {len(stored)} stored samples, {len(k.producers)} producers"
        )
        for p, (where, s) in enumerate(zip(st.pc, st.owns, strict=True)):
            assert (where == "idle") == (s == NO_SAMPLE), f"ResidencyBound: producer {k.producers[p]} {where} owns {s}"
            assert where == "idle" or st.status[s] == "stored", (
                f"ResidencyBound: producer {k.producers[p]} holds {name(s)!r}, which is {st.status[s]}"
            )
        cap = len(k.samples) + 1 if k.max_samples is None else k.max_samples
        queued_count = sum(st.status[s] in HELD_BY_QUEUE for s in range(n))
        assert k.keep_dead or queued_count < max(cap, 2), (
            f"SampleCapRoom: the queue holds {queued_count} samples, the store's count cap is {cap}"
        )
        if cap >= 2 and not st.backlog and not st.kept and all(where == "idle" for where in st.pc):
            assert len(st.resident) < cap, (
                f"SampleCapRoom: every producer is between puts and the store is full ({len(st.resident)} of {cap})"
            )


def check_step(k: SpecConstants, before: SpecState, after: SpecState) -> None:
    """Assert every action property of the spec over one step ``before -> after``."""
    for s, sample in enumerate(k.samples):
        was, now = before.status[s], after.status[s]
        restored = not _known_settled(before, s) and now == "stored"
        requeued = s in before.kept and now == "pending"
        assert was != "acked" or now == "acked" or restored, f"ExactlyOnce: acked sample {sample!r} became {now!r}"
        assert was not in TERMINAL or now == was or restored or requeued, (
            f"SettledForGood: {was} sample {sample!r} became {now!r}"
        )
        reborn = now == "stored" or requeued  # the spec's Reborn(s): a new incarnation starts
        for attempt, (old, new) in enumerate(zip(before.lease[s], after.lease[s], strict=True)):
            if old in TERMINAL_LEASE and not reborn:
                assert new == old, f"StaleAckRejection: lease ({sample!r}, {attempt}) changed {old} -> {new}"
            if old != new and old != NO_LEASE and not reborn:
                assert any(src == old and dst == new for _, src, dst in LEASE_TRANSITIONS), (
                    f"LeaseStepsFollowMachine: lease ({sample!r}, {attempt}) moved {old} -> {new}"
                )
        given_back = any(
            old == "leased" and new == "pending" for old, new in zip(before.lease[s], after.lease[s], strict=True)
        )
        assert not given_back or after.deliveries[s] == before.deliveries[s], (
            f"GiveBackUncounted: sample {sample!r} given back with redelivery_count "
            f"{before.deliveries[s]} -> {after.deliveries[s]}"
        )
        if s in before.lost:
            failed = any(
                old == "leased" and new == "failed" for old, new in zip(before.lease[s], after.lease[s], strict=True)
            )
            assert not failed or now == "dead", f"LostReported: lost sample {sample!r} was failed back ({now!r})"
            assert now != "acked", f"LostReported: lost sample {sample!r} was acked"
        if before.lifecycle != "open" and was not in HELD_BY_QUEUE:
            assert now not in HELD_BY_QUEUE, f"ClosedRefusesPuts: sample {sample!r} was enqueued after close ({now!r})"
    capped = _at_sample_cap(k, before)
    if before.backpressure == "flowing" and after.backpressure == "paused":
        assert before.resident_bytes >= k.high_watermark or capped, (
            f"Hysteresis: paused at {before.resident_bytes} B, below the high watermark {k.high_watermark}"
        )
    if before.backpressure == "paused" and after.backpressure == "flowing":
        assert before.resident_bytes <= k.low_watermark and not capped, (
            f"Hysteresis: resumed at {before.resident_bytes} B, above the low watermark {k.low_watermark} "
            "or at the count cap"
        )
    assert before.lifecycle != "drained" or after.lifecycle == "drained", "ClosedRefusesPuts: a drained queue reopened"


# -- the step API -----------------------------------------------------------------------------------------


def _position(index: Mapping[str, int], kind: str, name: str) -> int:
    """``name``'s position among the mirror's ``kind``s (``index``, in the constants' order); ``KeyError`` naming
    the ones it has otherwise."""
    try:
        return index[name]
    except KeyError:
        raise KeyError(f"unknown {kind} {name!r}; the mirror's {kind}s are {tuple(index)}") from None


class SpecMirror:
    """One spec state driven action by action (see the module docstring for the API)."""

    def __init__(
        self, constants: SpecConstants, *, sizes: Mapping[str, int] | None = None, auto_drain: bool = True
    ) -> None:
        self.constants = constants
        self.auto_drain = auto_drain
        self._sample_index = {s: i for i, s in enumerate(constants.samples)}
        self._consumer_index = {c: i for i, c in enumerate(constants.consumers)}
        self._producer_index = {p: i for i, p in enumerate(constants.producers)}
        self._sizes: dict[int, int] = {}
        for sample, nbytes in (sizes or {}).items():
            self._sizes[self._s(sample)] = nbytes
        self.state = initial_state(constants)
        self._previous = self.state
        self._counts = dict.fromkeys(COUNTERS, 0)
        self._dead: list[str] = []
        self._armed: dict[str, int] = dict.fromkeys(FAULT_CALLS, 0)
        self._direct = False  # an enqueue bypassed the producer path: ResidencyBound does not apply
        self.events: list[tuple[str, dict[str, object]]] = []

    # -- name lookup ------------------------------------------------------
    def _s(self, sample: str) -> int:
        return _position(self._sample_index, "sample", sample)

    def _c(self, consumer: str) -> int:
        return _position(self._consumer_index, "consumer", consumer)

    def _p(self, producer: str) -> int:
        return _position(self._producer_index, "producer", producer)

    def _token(self, token: LeaseToken) -> tuple[int, int]:
        sample, attempt = token
        return self._s(sample), attempt

    def _size_tuple(self) -> tuple[int, ...]:
        base = self.constants.sizes()
        return tuple(self._sizes.get(s, size) for s, size in enumerate(base))

    # -- faults -----------------------------------------------------------
    def arm_fault(self, call: str, times: int = 1) -> None:
        """The next ``times`` store calls named ``call`` fail (one-shot each), as a fault-injecting store does."""
        if call not in self._armed:
            raise ValueError(f"unknown store call {call!r}; known: {FAULT_CALLS}")
        self._armed[call] += times

    def armed_faults(self) -> dict[str, int]:
        return {call: n for call, n in self._armed.items() if n}

    def clear_faults(self) -> None:
        """Disarm every fault not fired yet (faults have cleared)."""
        self._armed = dict.fromkeys(FAULT_CALLS, 0)

    def _take(self, *calls: str) -> bool:
        """Whether an armed fault of one of ``calls`` fires now (it is consumed)."""
        for call in calls:
            if self._armed[call]:
                self._armed[call] -= 1
                return True
        return False

    def _armed_for(self, *calls: str) -> bool:
        return any(self._armed[call] for call in calls)

    # -- applying actions ---------------------------------------------------
    def _apply(self, step: _Step | None) -> bool:
        if step is None:
            return False
        self._previous = self.state
        self.state = step.state
        for action, s, call in step.events:
            counter = _COUNTER_OF_EVENT.get(action)
            if counter is not None:
                self._counts[counter] += 1
            if action == DEAD_LETTER:
                self._dead.append(self.constants.samples[s])
            elif action in (REQUEUE_DEAD_LETTER, PURGE_DEAD_LETTER):
                self._dead.remove(self.constants.samples[s])
            fields: dict[str, object] = {"sample_id": self.constants.samples[s]} if s >= 0 else {}
            if call:
                fields["call"] = call
            self.events.append((action, fields))
        return not any(a in (STALE_REJECTED, DEDUP_REFUSED) for a, _, _ in step.events)

    def store_put(self, sample: str, nbytes: int | None = None) -> bool:
        """StorePut: ``sample``'s bytes land in the store (``nbytes`` overrides the model size); no producer."""
        s = self._s(sample)
        if nbytes is not None and self.state.status[s] == "absent":
            self._sizes[s] = nbytes
        applied = self._apply(a_store_put(self.constants, self.state, s, self._size_tuple()))
        self._direct |= applied
        return applied

    def put(self, sample: str) -> bool:
        """Put: enqueue a stored sample; ``False`` if not stored-and-unqueued or the queue is closed."""
        applied = self._apply(a_put(self.constants, self.state, self._s(sample)))
        self._direct |= applied
        return applied

    def reput(self, sample: str) -> bool:
        """Reput: re-put of an acked/dead id; ``False`` when refused (dedup) or not applicable."""
        s = self._s(sample)
        return self._apply(a_reput(self.constants, self.state, s, self._size_tuple()))

    def acquire(self, consumer: str) -> LeaseToken | None:
        """Acquire: the FIFO head's new lease token, or ``None`` (empty, or the consumer holds ``max_held``)."""
        step = a_acquire(self.constants, self.state, self._c(consumer))
        if not self._apply(step):
            return None
        assert step is not None and step.token is not None
        s, attempt = step.token
        return self.constants.samples[s], attempt

    def _forged(self, t: tuple[int, int]) -> bool:
        self._apply(_Step(self.state, ((STALE_REJECTED, t[0], ""),)))
        return False

    def _settling(self, sample: int) -> bool:
        """Whether settling ``sample`` now would call scrub (the live lease retires it, and ``KeepDead`` does not
        keep its bytes), so a scrub fault fires."""
        return not self.constants.keep_dead and self.state.deliveries[sample] + 1 >= self.constants.max_deliveries

    def ack(self, consumer: str, token: LeaseToken) -> bool:
        """Ack: ``True`` when the live lease was acked (even if its scrub failed); ``False``: stale or forged."""
        return self._settle(consumer, token, ACK)

    def fail(self, consumer: str, token: LeaseToken) -> bool:
        """Fail: ``True`` when the live lease was failed (redelivered, or dead-lettered even if its scrub failed)."""
        return self._settle(consumer, token, FAIL)

    def reject(self, consumer: str, token: LeaseToken) -> bool:
        """Reject: ``True`` when the live lease of an untrainable sample was dead-lettered (even if its scrub
        failed); ``False``: stale or forged."""
        c, t = self._c(consumer), self._token(token)
        if t not in self.state.held[c]:
            return self._forged(t)
        fault = _is_live(self.state, t) and not self.constants.keep_dead and self._take("scrub")
        return self._apply(a_reject(self.constants, self.state, c, t, self._size_tuple(), fault, self.auto_drain))

    def _settle(self, consumer: str, token: LeaseToken, trigger: str) -> bool:
        c, t = self._c(consumer), self._token(token)
        if t not in self.state.held[c]:
            return self._forged(t)
        # An armed scrub fault fires only where the settle calls scrub: an ack, or a fail that dead-letters.
        scrubs = trigger == ACK or self._settling(t[0])
        fault = _is_live(self.state, t) and scrubs and self._take("scrub")
        return self._apply(
            a_settle(self.constants, self.state, c, t, self._size_tuple(), trigger, fault, self.auto_drain)
        )

    def extend(self, consumer: str, token: LeaseToken) -> bool:
        """Extend: ``True`` when granted; ``False`` is the implementation's ``LeaseLost``."""
        c, t = self._c(consumer), self._token(token)
        if t not in self.state.held[c]:
            return self._forged(t)
        return self._apply(a_extend(self.constants, self.state, c, t))

    def reclaim(self, sample: str) -> bool:
        """Reclaim: ``sample``'s live lease passed its deadline and the reaper took it back."""
        s = self._s(sample)
        fault = self.state.status[s] == "leased" and self._settling(s) and self._armed_for("scrub")
        step = a_reclaim(self.constants, self.state, s, self._size_tuple(), fault, self.auto_drain)
        if step is not None and fault:
            self._take("scrub")
        return self._apply(step)

    def reclaim_expired(self, order: Iterable[str]) -> int:
        """Reclaim the live leases of ``order`` (the implementation reaps in deadline order); return how many."""
        return sum(self.reclaim(sample) for sample in order)

    def get(self, consumer: str, sample: str) -> bool:
        """Get: the consumer opens a store handle on a resident sample it holds a lease of."""
        return self._apply(a_get(self.constants, self.state, self._c(consumer), self._s(sample)))

    def release(self, consumer: str, sample: str) -> bool:
        """Release: the consumer drops its handle on ``sample``."""
        s = self._s(sample)
        return self._apply(a_release(self.constants, self.state, self._c(consumer), s, self._size_tuple()))

    def store_loses(self, sample: str) -> bool:
        """StoreLoses: the store loses a queued sample's bytes while no consumer reads it."""
        s = self._s(sample)
        return self._apply(a_store_loses(self.constants, self.state, s, self._size_tuple()))

    def lose(self, consumer: str, token: LeaseToken) -> bool:
        """Lose: the consumer whose get found the bytes lost reports it; ``False``: stale (nothing changed)."""
        c, t = self._c(consumer), self._token(token)
        if t not in self.state.held[c]:
            return self._forged(t)
        return self._apply(a_lose(self.constants, self.state, c, t, self.auto_drain))

    def give_back(self, consumer: str, token: LeaseToken) -> bool:
        """GiveBack: the consumer hands back a lease it did not use; ``False``: stale or forged (nothing changed)."""
        c, t = self._c(consumer), self._token(token)
        if t not in self.state.held[c]:
            return self._forged(t)
        return self._apply(a_give_back(self.constants, self.state, c, t, bounded=False))

    def lost(self) -> set[str]:
        """The samples whose bytes the store lost (until a producer stores the id anew)."""
        return {self.constants.samples[s] for s in self.state.lost}

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
            return PAUSE
        if self.resume():
            return RESUME
        return None

    def close(self) -> bool:
        """Close (``CloseStep``): refuse puts, wake producers; drained at once when nothing is pending or leased."""
        return self._apply(a_close(self.constants, self.state, self.auto_drain))

    def drain(self) -> bool:
        return self._apply(a_drain(self.constants, self.state))

    def retry_scrub(self, sample: str) -> bool:
        """RetryScrub: retry ``sample``'s owed scrub/unretain; ``True`` when it went through (armed faults fail it)."""
        s = self._s(sample)
        if s not in self.state.backlog:
            return False
        call = "scrub" if self.state.status[s] in TERMINAL | {"discarded"} else "unretain"
        fault = self._take(call, "gc")
        self._apply(a_retry_scrub(self.constants, self.state, s, self._size_tuple(), fault))
        return not fault

    def retry_backlog(self) -> int:
        """Retry every backlog entry (what ``gc`` does); return how many went through."""
        return sum(self.retry_scrub(self.constants.samples[s]) for s in sorted(self.state.backlog))

    # -- dead-letter repair ------------------------------------------------------
    def requeue_dead_letter(self, sample: str) -> bool:
        """RequeueDeadLetter: ``requeue_dead_letters([sample])`` -- ``False`` (refused, nothing changed) unless
        ``sample`` is a dead letter whose bytes are kept and the queue is not drained."""
        s = self._s(sample)
        if sample not in self._dead:
            return False
        return self._apply(a_requeue_dead_letter(self.constants, self.state, s, bounded=False))

    def purge_dead_letter(self, sample: str) -> bool:
        """PurgeDeadLetter: ``purge_dead_letters([sample])`` -- ``False`` when ``sample`` is no dead letter; kept
        bytes are scrubbed (an armed ``scrub`` fault makes it owed); a dead letter without kept bytes just leaves
        the list."""
        s = self._s(sample)
        if sample not in self._dead:
            return False
        if s not in self.state.kept:
            return self._apply(_Step(self.state, ((PURGE_DEAD_LETTER, s, ""),)))
        fault = self._take("scrub")
        return self._apply(a_purge_dead_letter(self.constants, self.state, s, self._size_tuple(), fault))

    # -- producers ------------------------------------------------------------
    def producer_store(self, producer: str, sample: str, nbytes: int | None = None) -> bool:
        """ProducerStore: an idle producer writes ``sample`` and enters ``put_blocks_until_below``."""
        p, s = self._p(producer), self._s(sample)
        if nbytes is not None and _storable(self.state, s):
            self._sizes[s] = nbytes
        return self._apply(a_producer_store(self.constants, self.state, p, s, self._size_tuple()))

    def producer_pause(self, producer: str) -> bool:
        """PauseP: the waiting producer's hysteresis step pauses."""
        return self._apply(a_pause_p(self.constants, self.state, self._p(producer)))

    def producer_resume(self, producer: str) -> bool:
        """ResumeP: the waiting producer's hysteresis step resumes."""
        return self._apply(a_resume_p(self.constants, self.state, self._p(producer)))

    def may_enqueue(self) -> bool:
        """``MayEnqueue``: flowing below the high watermark, or (the fix) paused with nothing pending or leased."""
        return _may_enqueue(self.constants, self.state)

    def producer_enqueue(self, producer: str) -> bool:
        """Enqueue (or RetainFails when a ``retain`` fault is armed: the producer's put raises)."""
        p = self._p(producer)
        if _waiting(self.state, p) and _may_enqueue(self.constants, self.state) and self._take("retain"):
            self._apply(a_retain_fails(self.constants, self.state, p))
            return False
        return self._apply(a_enqueue(self.constants, self.state, p))

    def producer_poll(self, producer: str) -> str:
        """One round of ``put_blocks_until_below``; returns what happened.

        ``"closed"`` (ClosedRaise; an armed ``unretain`` fault fails the
        unretain), ``"health-failed"`` (HealthFails), ``"Pause"``/``"Resume"``
        (the hysteresis fired: the code runs the callback and polls again),
        ``"enqueued"``, ``"retain-failed"``, ``"wait"``, or ``"not-waiting"``.
        """
        p = self._p(producer)
        st = self.state
        if st.pc[p] != "waiting":
            return "not-waiting"
        if st.lifecycle != "open":
            fault = self._take("unretain")
            self._apply(a_closed_raise(self.constants, st, p, fault))
            return "closed"
        if self._take("health"):
            self._apply(a_health_fails(self.constants, st, p))
            return "health-failed"
        if self.producer_pause(producer):
            return PAUSE
        if self.producer_resume(producer):
            return RESUME
        if not self.may_enqueue():
            return "wait"
        return "enqueued" if self.producer_enqueue(producer) else "retain-failed"

    def producer_abort(self, producer: str) -> bool:
        """Abort: ``abort_when()`` returned True for a waiting producer."""
        return self._apply(a_abort(self.constants, self.state, self._p(producer)))

    def producer_closed(self, producer: str) -> bool:
        """ClosedRaise: close woke the producer; its put raises (an armed ``unretain`` fault fails the unretain)."""
        p = self._p(producer)
        if self.state.pc[p] != "waiting" or self.state.lifecycle == "open":
            return False
        return self._apply(a_closed_raise(self.constants, self.state, p, self._take("unretain")))

    def producer_discard(self, producer: str) -> bool:
        """Discard: the producer evicts the sample whose put raised or aborted."""
        return self._apply(a_discard(self.constants, self.state, self._p(producer), self._size_tuple()))

    def producer_state(self, producer: str) -> str:
        """``pc[p]``: ``idle``, ``waiting`` (blocked in ``put_blocks_until_below``) or ``aborted``."""
        return self.state.pc[self._p(producer)]

    def producer_sample(self, producer: str) -> str | None:
        """The sample the producer stored and still holds, if any."""
        s = self.state.owns[self._p(producer)]
        return None if s == NO_SAMPLE else self.constants.samples[s]

    def finished(self) -> bool:
        """``Done`` is enabled: drained, every producer idle, the backlog worked off."""
        return _finished(self.state)

    # -- observation ----------------------------------------------------------
    def status(self, sample: str) -> str:
        return self.state.status[self._s(sample)]

    def pending_order(self) -> list[str]:
        return [self.constants.samples[s] for s in self.state.queue]

    def resident(self) -> set[str]:
        return {self.constants.samples[s] for s in self.state.resident}

    def kept(self) -> set[str]:
        """Dead letters whose bytes stay retained for a requeue."""
        return {self.constants.samples[s] for s in self.state.kept}

    def backlog(self) -> set[str]:
        """Samples whose failed scrub (or unretain) is still being retried."""
        return {self.constants.samples[s] for s in self.state.backlog}

    def dedup_window(self) -> list[str]:
        """The settled ids the queue remembers, oldest first."""
        return [self.constants.samples[s] for s in self.state.window]

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
        check_state(self.constants, self.state, self._sizes, bound=not self._direct)
        check_step(self.constants, self._previous, self.state)


_BUG_SWITCHES = {
    "BugStaleRelease": "A",
    "BugNoScrub": "B",
    "BugNoDedup": "C",
    "BugNoDeliveryLimit": "D",
    "BugNoReaper": "E",
    "BugProducerBytesCounted": "P",
    "BugScrubFailUnsettles": "S",
    "BugRequeueAnySettled": "R",
    "BugOnlyBytes": "O",
    "BugLostRedelivered": "L",
    "BugUntrainedAcked": "U",
}


def constants_from_config(text: str) -> SpecConstants:
    """The ``SpecConstants`` of a TLC model config's ``CONSTANTS`` (model values become their names).

    Model parameters the config leaves out take the spec's defaults (no
    producers, no faults, a dedup window of every sample, one size).
    """
    values: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.split("\\*", 1)[0].partition("=")
        if sep and name.strip().isidentifier():
            values[name.strip()] = value.strip()

    def names(key: str) -> tuple[str, ...]:
        return tuple(v.strip() for v in values.get(key, "{}").strip("{}").split(",") if v.strip())

    return SpecConstants(
        samples=names("Samples"),
        consumers=names("Consumers"),
        producers=names("Producers"),
        max_deliveries=int(values["MaxDeliveries"]),
        high_watermark=int(values["HighWatermark"]),
        low_watermark=int(values["LowWatermark"]),
        max_held=int(values["MaxHeld"]),
        sample_bytes=int(values["SampleBytes"]),
        large_samples=frozenset(names("LargeSamples")),
        large_bytes=int(values["LargeBytes"]) if "LargeBytes" in values else None,
        max_faults=int(values.get("MaxFaults", "0")),
        dedup_window=int(values["DedupWindow"]) if "DedupWindow" in values else None,
        keep_dead=values.get("KeepDead") == "TRUE",
        max_samples=int(values["MaxSamples"]) if "MaxSamples" in values else None,
        max_losses=int(values.get("MaxLosses", "0")),
        untrainable=frozenset(names("Untrainable")),
        max_give_backs=int(values.get("MaxGiveBacks", "0")),
        bugs=frozenset(bug for switch, bug in _BUG_SWITCHES.items() if values.get(switch) == "TRUE"),
    )
