"""Trace validation: does ``spec/LeaseQueue.tla`` admit what the implementation did -- names AND values?

The queue's ``tracer`` hook reports every action under the queue lock
(``spec.recording.TraceRecorder`` records them; ``TraceRecorder.wrap(store)`` also records
the store calls ``put``/``get``/``release``/``scrub``). ``validate_traces`` renders
the recorded traces as data (a generated ``TraceData`` module) for
``spec/LeaseQueueTrace.tla``, which EXTENDS LeaseQueue -- a cursor
``i`` over trace ``tr``, each event matched to the spec action it names -- and
has TLC explore it: a trace is admitted when some behaviour of the spec
consumes all of its events. Many traces share one TLC run (``tr`` is chosen in
the initial state), so the JVM starts once. The verdicts are printed (``PrintT``)
rather than raised as violations, and the end of a trace, consumed or stuck, is
an explicit terminal step: TLC runs with deadlock checking, as everywhere.

Values. Every field an event carries is checked against the spec's NEXT state
(a missing field is not checked, so traces of older backends still validate;
a present one always is): ``n`` is the redelivery count of the lease concerned
(``deliveries``, or the attempt of the held lease), ``pending`` is
``Len(queue')``, ``outstanding`` the number of leased samples, ``resident_bytes``
is ``residentBytes'``. The spec's time is abstract, so the trace module keeps
the queue's clock and each lease's deadline as auxiliary variables, updated
from the events' ``now``/``deadline`` fields (in integer microseconds from the
trace's earliest time, coarser for very long traces): the clock never goes back; ``Acquire`` sets the
deadline to the acquiring call's clock + ``TraceConstants.visibility_timeout``
(between the previous event's ``now`` and this one's, one tick of rounding);
``Extend`` happens only to a lease whose deadline has not passed and sets one
not in the past; ``Reclaim`` happens only at or after the lease's deadline.

How events map to the spec: every lease is held by its own virtual consumer
(numbered per trace), so consumer crashes are simply leases nobody settles.
A store ``get``/``release`` is the spec's ``Get``/``Release`` by some consumer;
a ``scrub`` must concern a settled sample. Traces recorded without a wrapped
store get a ``StorePut`` inserted before the queue first sees a sample (or
earlier, when an event reports more resident bytes than the samples stored so
far); the store may then hold samples the trace never names, so their
``resident_bytes`` are checked as a lower bound of the spec's. A
``Fail``/``Reclaim`` followed by ``DeadLetter`` of the same sample must end
``dead`` (else ``pending``, at the tail); an ``Ack`` or dead letter
followed by a ``StoreFault`` of its scrub is the spec's settle with a failed
scrub (the sample joins the retry backlog), ``ScrubRetried`` is the spec's
successful ``RetryScrub``. ``StaleRejected`` is admitted only when the lease it
names is not live in the spec (settled, reclaimed, never issued), or when the
event says the token was ``forged`` (a copy of a live lease object). A
``Resident`` observation (``TraceRecorder.observe_residency``) demands the
store's resident set -- and, with a wrapped store, its resident bytes -- equal
the spec's. Batch calls are traced as their per-item events, one step each.

Concurrency. A wrapped store records its calls when it makes them, from any
thread; the queue's events are recorded under its lock, but a Pause, Resume or
a put reporting ``resident_bytes`` was decided on a ``health()`` read earlier in
its operation, and a settle changes the store only at its scrub, later in it.
So TLC may take such a Pause/Resume/Put before the store calls recorded between
the operation's previous event and it, and the store calls recorded between a
settle and its scrub before the settle (``_linearize``); nothing else moves.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from featurestream.common.checks import check_count, check_flag, check_seconds
from featurestream.core import events
from featurestream.spec.recording import STORE_GET, STORE_PUT, STORE_RELEASE, STORE_SCRUB, Event
from featurestream.spec.tlc import TLCResult, run_tlc, spec_dir

__all__ = ["TraceConstants", "TraceResult", "validate_trace", "validate_traces"]

_KNOWN = events.ALL | {STORE_PUT, STORE_GET, STORE_RELEASE, STORE_SCRUB}
# Recorded outside the queue's lock (producers and consumers call the store themselves): they may fall
# between two events of one queue operation, so looking ahead within an operation skips them.
_BYSTANDERS = frozenset({STORE_PUT, STORE_GET, STORE_RELEASE, events.RESIDENT})

UNKNOWN = -1  # a value the event did not carry: not checked
MICROSECONDS = 1_000_000.0  # ticks per second of the trace module's clock, unless the trace is too long for that
_TLC_INT_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class TraceConstants:
    """The queue's configuration the spec needs.

    ``max_deliveries``; ``sample_bytes``, every sample's size; the watermarks in
    bytes (leave ``None`` when the trace has no Pause/Resume); and the queue's
    ``visibility_timeout`` in seconds (``None``: Acquire deadlines not checked);
    ``keep_dead_letters``, the spec's ``KeepDead``: the queue keeps every dead
    letter's bytes (``keep_dead_letter_bytes`` > 0 with a cap no dead letter of
    the trace exceeds; a ``DeadLetter`` event's ``kept`` field is checked).
    """

    max_deliveries: int
    sample_bytes: int = 1
    high_watermark: int | None = None
    low_watermark: int | None = None
    visibility_timeout: float | None = None
    keep_dead_letters: bool = False

    def __post_init__(self) -> None:
        check_count("max_deliveries", self.max_deliveries, minimum=1)
        check_count("sample_bytes", self.sample_bytes, minimum=1)
        check_count("high_watermark", self.high_watermark, allow_none=True)
        check_count("low_watermark", self.low_watermark, allow_none=True)
        if self.visibility_timeout is not None:
            check_seconds("visibility_timeout", self.visibility_timeout, positive=True)
        check_flag("keep_dead_letters", self.keep_dead_letters)


@dataclasses.dataclass(frozen=True)
class TraceResult:
    """The verdict on one trace: ``admitted``, how many spec steps matched, the first unmatched event and why."""

    admitted: bool
    matched_steps: int
    total_steps: int
    stuck_at: Mapping[str, object] | None
    tlc: TLCResult
    why: str = ""  # for a rejected trace: which part of the unmatched event failed

    def explain(self) -> str:
        if self.admitted:
            return f"trace admitted by the spec ({self.total_steps} steps)"
        return (
            f"trace REJECTED: the spec admits the first {self.matched_steps} of {self.total_steps} steps; "
            f"no spec action matches step {self.matched_steps + 1}: {self.stuck_at} -- {self.why}"
        )


@dataclasses.dataclass(frozen=True)
class _Step:
    """One step of the trace module: the spec action, its arguments, and the values to check (UNKNOWN: none)."""

    action: str
    sample: str = ""
    lease: int = 0
    outcome: str = ""
    flag: bool = False
    observed: tuple[str, ...] = ()
    n: int = UNKNOWN
    pending: int = UNKNOWN
    outstanding: int = UNKNOWN
    resident_bytes: int = UNKNOWN
    now: int = UNKNOWN
    deadline: int = UNKNOWN
    ahead: tuple[int, ...] = ()  # later steps (1-based) that may be taken before this one: see _linearize
    source: Mapping[str, object] | None = None


def _count(fields: Mapping[str, object], name: str) -> int:
    value = fields.get(name)
    if value is None:
        return UNKNOWN
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"trace field {name!r} must be an int >= 0, got {value!r}")
    return value


class _Clock:
    """A trace's times as TLC integers: ticks from its earliest ``now``/``deadline``.

    A tick is a microsecond, or coarser for traces too long for TLC's 32-bit
    integers (a deadline and the visibility timeout added to it must fit).
    """

    def __init__(self, trace: Sequence[Event], visibility_timeout: float | None) -> None:
        times = [f[k] for _, f in trace for k in ("now", "deadline") if f.get(k) is not None]
        for value in times:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"trace times must be finite numbers, got {value!r}")
        self.origin = float(min(times, default=0.0))
        seconds = float(max(times, default=0.0)) - self.origin + (visibility_timeout or 0.0)
        self.per_second = MICROSECONDS
        while seconds * self.per_second > _TLC_INT_MAX // 4:
            self.per_second /= 10
        self.visibility = UNKNOWN if visibility_timeout is None else round(visibility_timeout * self.per_second)

    def ticks(self, value: object) -> int:
        return UNKNOWN if value is None else round((float(value) - self.origin) * self.per_second)  # type: ignore[arg-type]


def _next_in_operation(trace: Sequence[Event], index: int) -> int | None:
    """Index of the first event after ``index`` recorded by the queue itself (skipping bystanders)."""
    for later in range(index + 1, len(trace)):
        if trace[later][0] not in _BYSTANDERS:
            return later
    return None


def _is(trace: Sequence[Event], index: int | None, action: str, sample: str, call: str | None = None) -> bool:
    if index is None:
        return False
    name, fields = trace[index]
    return name == action and fields.get("sample_id") == sample and (call is None or fields.get("call") == call)


def _stores_traced(trace: Sequence[Event]) -> bool:
    """Whether the trace shows the store's writes (recorded through ``TraceRecorder.wrap``)."""
    return any(action == STORE_PUT for action, _ in trace)


def _offers(action: str, fields: Mapping[str, object]) -> bool:
    """Whether the event is the queue handling a put of the sample it names: its Put, or a failed retain or
    unretain (a put refused after its retain, e.g. by a Redis queue that turned out closed, owes the unretain)."""
    return action == events.PUT or (action == events.STORE_FAULT and fields.get("call") in ("retain", "unretain"))


class _StorePutInference:
    """For a trace without store events: when was each sample stored?

    Right before the queue first sees it (its put, its failed retain or unretain), or
    earlier when an event reports more resident bytes than the samples stored
    so far: producers store before they wait to enqueue.
    """

    def __init__(self, trace: Sequence[Event], sample_bytes: int) -> None:
        self._sample_bytes = sample_bytes
        self._first_seen = list(dict.fromkeys(str(f.get("sample_id", "")) for a, f in trace if _offers(a, f)))
        self._stored: set[str] = set()
        self._settled: set[str] = set()

    def before(self, action: str, fields: Mapping[str, object], source: Mapping[str, object]) -> list[_Step]:
        """The ``StorePut`` steps to insert before this event."""
        sample = str(fields.get("sample_id") or "")
        stores = [sample] if _offers(action, fields) and sample not in self._stored else []
        reported = fields.get("resident_bytes")
        if isinstance(reported, int):
            missing = reported // self._sample_bytes - len((self._stored | set(stores)) - self._settled)
            stores += [s for s in self._first_seen if s not in self._stored and s not in stores][: max(missing, 0)]
        if action in (events.ACK, events.DEAD_LETTER):
            self._settled.add(sample)
        elif action == events.REQUEUE_DEAD_LETTER:
            self._settled.discard(sample)
        self._stored.update(stores)
        return [_Step(STORE_PUT, s, source=source) for s in stores]


def _settle_scrub_faults(trace: Sequence[Event]) -> set[int]:
    """Indices of the ``StoreFault`` events of a settle's own scrub (right after its Ack, DeadLetter or purge)."""
    faults: set[int] = set()
    for index, (action, fields) in enumerate(trace):
        following = _next_in_operation(trace, index)
        if action in (events.ACK, events.DEAD_LETTER, events.PURGE_DEAD_LETTER) and _is(
            trace, following, events.STORE_FAULT, str(fields.get("sample_id")), "scrub"
        ):
            faults.add(following)  # type: ignore[arg-type]
    return faults


def _fault_step(call: str, own_scrub: bool) -> str:
    """The trace module's step for a ``StoreFault`` of store call ``call``."""
    if own_scrub:
        return "ScrubFault"  # the settle just before it already took the fault
    return {"retain": "RetainFault", "unretain": "UnretainFault", "scrub": "RetryFault"}.get(call, "OtherFault")


def _steps(trace: Sequence[Event], sample_bytes: int, clock: _Clock) -> list[_Step]:
    """Events -> spec steps: names resolved by looking ahead within an operation, values converted."""
    trace = list(trace)
    for index, (action, _) in enumerate(trace):
        if action not in _KNOWN:
            raise ValueError(f"trace event {index} has unknown action {action!r}; known: {sorted(_KNOWN)}")
    inference = None if _stores_traced(trace) else _StorePutInference(trace, sample_bytes)
    scrub_faults = _settle_scrub_faults(trace)
    # Leases become consumers 1..n of this trace: small, dense domains keep TLC's states small.
    consumer_of: dict[object, int] = {}
    steps: list[_Step] = []
    for index, (action, fields) in enumerate(trace):
        sample = str(fields.get("sample_id") or "")
        lease = fields.get("lease_id")
        if action == events.ACQUIRE and lease is not None:
            consumer_of.setdefault(lease, len(consumer_of) + 1)
        consumer = consumer_of.get(lease, UNKNOWN)
        source = {"index": index, "action": action, **fields}
        values = dict(
            n=_count(fields, "n"),
            pending=_count(fields, "pending"),
            outstanding=_count(fields, "outstanding"),
            resident_bytes=_count(fields, "resident_bytes"),
            now=clock.ticks(fields.get("now")),
            deadline=clock.ticks(fields.get("deadline")),
            source=source,
        )
        if inference is not None:
            steps += inference.before(action, fields, source)
        following = _next_in_operation(trace, index)
        if action == events.ACK:
            steps.append(_Step(action, sample, consumer, flag=following in scrub_faults, **values))
        elif action in (events.FAIL, events.RECLAIM):
            dead = _is(trace, following, events.DEAD_LETTER, sample)
            fault = dead and following is not None and _next_in_operation(trace, following) in scrub_faults
            steps.append(_Step(action, sample, consumer, "dead" if dead else "pending", fault, **values))
        elif action == events.DEAD_LETTER:
            kept = {True: "kept", False: "scrubbed"}.get(fields.get("kept"), "")  # type: ignore[call-overload]
            steps.append(_Step(action, sample, consumer, kept, **values))
        elif action == events.PURGE_DEAD_LETTER:
            steps.append(_Step(action, sample, consumer, flag=following in scrub_faults, **values))
        elif action == events.STALE_REJECTED:
            forged = fields.get("forged") is True
            steps.append(_Step(action, sample, consumer_of.get(lease, 0), str(fields.get("op", "")), forged, **values))
        elif action == events.RESIDENT:
            observed = tuple(sorted(map(str, fields.get("samples", ()))))  # type: ignore[call-overload]
            steps.append(_Step(action, observed=observed, **values))
        elif action == events.STORE_FAULT:
            steps.append(_Step(_fault_step(str(fields.get("call", "")), index in scrub_faults), sample, **values))
        else:
            steps.append(_Step(action, sample, consumer, **values))
    return _linearize(steps)


def _linearize(steps: list[_Step]) -> list[_Step]:
    """Mark the later steps that may have taken effect before a step: the order a concurrent trace leaves open.

    The store events of a wrapped store (``_BYSTANDERS``) are recorded when the store acted; the
    queue's events when the queue traced them, under its lock. Two of the queue's events took
    effect at another moment than the one they were recorded at:

    - a Pause, Resume, or a Put that reports ``resident_bytes``, decided on the store's
      ``health()`` read earlier in the same locked operation: store calls of other threads
      recorded just before it (after the operation's previous event) may have come after that
      read -- the step may be taken before any of them;
    - a settle (Ack, Fail, Reclaim, PurgeDeadLetter) whose scrub follows in the same operation
      changes the store only at that scrub: store calls recorded between the two came before
      it -- they may be taken before the settle.

    TLC picks the order that matches; every other order stays the recorded one.
    """
    ahead: list[list[int]] = [[] for _ in steps]
    for index, step in enumerate(steps):
        if step.action in (events.PAUSE, events.RESUME) or (step.action == events.PUT and step.resident_bytes >= 0):
            before = index - 1
            while before >= 0 and steps[before].action in _BYSTANDERS:
                ahead[before].append(index + 1)
                before -= 1
        elif step.action in (events.ACK, events.FAIL, events.RECLAIM, events.PURGE_DEAD_LETTER):
            later, passed = index + 1, []
            while later < len(steps) and (
                steps[later].action in _BYSTANDERS
                or (steps[later].action == events.DEAD_LETTER and steps[later].sample == step.sample)
            ):
                if steps[later].action in _BYSTANDERS:
                    passed.append(later + 1)
                later += 1
            if later < len(steps) and steps[later].action == STORE_SCRUB and steps[later].sample == step.sample:
                ahead[index] = passed
    return [dataclasses.replace(step, ahead=tuple(a)) if a else step for step, a in zip(steps, ahead, strict=True)]


def _tla_string(value: str) -> str:
    return json.dumps(value)  # TLA+ string literals share JSON's escapes for the characters ids use


def _record(step: _Step) -> str:
    observed = ", ".join(_tla_string(s) for s in step.observed)
    return (
        f'[a |-> "{step.action}", s |-> {_tla_string(step.sample)}, l |-> {step.lease}, '
        f"o |-> {_tla_string(step.outcome)}, f |-> {'TRUE' if step.flag else 'FALSE'}, obs |-> {{{observed}}}, "
        f"n |-> {step.n}, pend |-> {step.pending}, out |-> {step.outstanding}, rb |-> {step.resident_bytes}, "
        f"now |-> {step.now}, dl |-> {step.deadline}, ah |-> {{{', '.join(map(str, step.ahead))}}}]"
    )


# The trace-validation module, next to LeaseQueue.tla; it extends TraceData, the only TLA+ generated per run.
_TRACE_MODULE = "LeaseQueueTrace.tla"
_TRACE_DATA = """---- MODULE TraceData ----
(* Generated by featurestream.spec.trace: {count} implementation trace(s) to validate against LeaseQueue. *)
EXTENDS Integers

TraceSamples == {samples}
TraceUntrainable == {untrainable}  \\* rejected: a Fail that dead-letters with deliveries left
TraceConsumers == {consumers}
Log == <<
{log}
>>
Exact == <<{exact}>>  \\* per trace: does it show the store's writes (TraceRecorder.wrap)?
Visibility == <<{visibility}>>  \\* per trace: its visibility timeout in its ticks; -1: not checked
====
"""

_TRACE_CONFIG = """SPECIFICATION TraceSpec
CONSTANTS
    Samples <- TraceSamples
    Untrainable <- TraceUntrainable
    Consumers <- TraceConsumers
    MaxDeliveries = {max_deliveries}
    HighWatermark = {high}
    LowWatermark = {low}
    MaxHeld = 1
    SampleBytes = {sample_bytes}
    MaxFaults = {faults}
    BugStaleRelease = FALSE
    BugNoScrub = FALSE
    BugNoDedup = FALSE
    BugNoDeliveryLimit = FALSE
    BugNoReaper = FALSE
    KeepDead = {keep_dead}
INVARIANT
    TraceReport
"""

_REPORT = re.compile(r'^<<"(matched|stuck)", (\d+)((?:, (?:\d+|TRUE|FALSE))*)>>$', re.M)


def _why(action: str, enabled: bool, values: bool, timing: bool) -> str:
    """Why the trace module's step for ``action`` could not be taken, from what TLC found enabled."""
    if not enabled:
        return f"the spec does not allow {action} here (its state, sample, lease or redelivery count n differ)"
    if not values:
        return f"the spec allows {action}, but not with the pending/outstanding/resident_bytes it reports"
    if not timing:
        return f"the spec allows {action}, but its now/deadline break the clock rules"
    return f"the spec allows {action} with its values and with its timing, but not with both"


def validate_traces(
    traces: Sequence[Iterable[Event]], constants: TraceConstants, *, timeout: float | None = 600
) -> list[TraceResult]:
    """Validate every trace in one TLC run; one ``TraceResult`` per trace, in order.

    Raises ``ToolMissing`` without Java/TLC, ``ValueError`` for an unknown
    event or a malformed value, ``RuntimeError`` when TLC fails for a reason
    other than a verdict.
    """
    traces = [list(trace) for trace in traces]
    clocks = [_Clock(trace, constants.visibility_timeout) for trace in traces]
    all_steps = [_steps(trace, constants.sample_bytes, clock) for trace, clock in zip(traces, clocks, strict=True)]
    if not all_steps:
        return []
    samples = sorted({s for steps in all_steps for step in steps for s in (step.sample, *step.observed) if s})
    consumers = max((step.lease for steps in all_steps for step in steps), default=0)
    # A reject is traced as a Fail that dead-letters the sample with deliveries left: the sample is untrainable.
    untrainable = sorted(
        {
            step.sample
            for steps in all_steps
            for step in steps
            if step.action == events.FAIL and step.outcome == "dead" and 0 <= step.n < constants.max_deliveries - 1
        }
    )
    faults = max(sum(action == events.STORE_FAULT for action, _ in trace) for trace in traces)
    empty = _record(_Step("End"))
    log = ",\n".join(f"  <<{', '.join(map(_record, steps)) if steps else empty}>>" for steps in all_steps)
    data = _TRACE_DATA.format(
        count=len(all_steps),
        samples="{" + ", ".join(map(_tla_string, samples or ["none"])) + "}",
        untrainable="{" + ", ".join(map(_tla_string, untrainable)) + "}",
        consumers=f"1..{max(consumers, 1)}",
        visibility=", ".join(str(clock.visibility) for clock in clocks),
        log=log,
        exact=", ".join("TRUE" if _stores_traced(trace) else "FALSE" for trace in traces),
    )
    high = constants.high_watermark if constants.high_watermark is not None else 1 << 30
    low = constants.low_watermark if constants.low_watermark is not None else 0
    config = _TRACE_CONFIG.format(
        max_deliveries=constants.max_deliveries,
        high=high,
        low=low,
        sample_bytes=constants.sample_bytes,
        faults=faults,
        keep_dead="TRUE" if constants.keep_dead_letters else "FALSE",
    )
    with tempfile.TemporaryDirectory(prefix="featurestream-trace-") as scratch:
        data_path = Path(scratch) / "TraceData.tla"
        data_path.write_text(data)
        config_path = Path(scratch) / "trace.cfg"
        config_path.write_text(config)
        result = run_tlc(
            config_path,
            modules=[spec_dir() / _TRACE_MODULE, data_path],
            main_module=_TRACE_MODULE,
            workers=1,
            timeout=timeout,
            check_deadlock=True,
        )
    if not result.ok:
        raise RuntimeError(f"TLC failed on the trace module: {result.error}\n{result.output[-3000:]}")
    admitted: set[int] = set()
    furthest: dict[int, tuple[int, str]] = {}  # trace -> the furthest stuck event (1-based) and why
    for name, tr, rest in _REPORT.findall(result.output):
        if name == "matched":
            admitted.add(int(tr))
            continue
        at, *enabled = rest.strip(", ").split(", ")
        step = all_steps[int(tr) - 1][int(at) - 1]
        why = _why(step.action, *(flag == "TRUE" for flag in enabled))
        furthest[int(tr)] = max(furthest.get(int(tr), (0, "")), (int(at), why))
    verdicts = []
    for number, steps in enumerate(all_steps, start=1):
        if number in admitted or not steps:
            verdicts.append(TraceResult(True, len(steps), len(steps), None, result))
            continue
        at, why = furthest.get(number, (1, ""))
        verdicts.append(TraceResult(False, at - 1, len(steps), steps[at - 1].source, result, why))
    return verdicts


def validate_trace(events: Iterable[Event], constants: TraceConstants, *, timeout: float | None = 600) -> TraceResult:
    """Validate one trace (see ``validate_traces``)."""
    return validate_traces([events], constants, timeout=timeout)[0]
