"""Trace validation: does ``spec/LeaseQueue.tla`` admit what the implementation did?

The queue's ``tracer`` hook reports every action under the queue lock
(``TraceRecorder`` records them). ``validate_traces`` renders the recorded
traces as one TLA+ module -- a cursor ``i`` over trace ``tr``, each event matched
to the spec action it names -- and has TLC explore it: a trace is admitted when
some behaviour of the spec consumes all of its events. Many traces share one
TLC run (``tr`` is chosen in the initial state), so the JVM starts once.

How events map to the spec: every lease is held by its own virtual consumer
(numbered per trace), so consumer crashes are simply leases nobody settles; the
producer's store write (``StorePut``) is inserted before a sample's first
``Put``; a ``Fail``/``Reclaim`` followed by ``DeadLetter`` of the same sample is
one spec step whose outcome must be ``dead`` (else ``pending``, at the tail);
``StaleRejected`` (a stale or forged lease) changes nothing; a
``Resident`` observation (``TraceRecorder.observe_residency``) demands the
store's resident set (of samples put so far) equal the spec's.
"""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from featurestream.core import events
from featurestream.spec.tlc import TLCResult, run_tlc
from featurestream.stores.base import FeatureStore

__all__ = ["TraceConstants", "TraceRecorder", "TraceResult", "validate_trace", "validate_traces"]

Event = tuple[str, Mapping[str, object]]

# Events the queue's tracer emits, plus the recorder's own observations.
_KNOWN = events.ALL


@dataclasses.dataclass(frozen=True)
class TraceConstants:
    """The queue's configuration the spec needs: ``max_deliveries`` and, for Pause/Resume, sizes and watermarks.

    ``sample_bytes`` is every sample's size; ``high_watermark``/``low_watermark``
    are in bytes (leave ``None`` when the trace has no Pause/Resume).
    """

    max_deliveries: int
    sample_bytes: int = 1
    high_watermark: int | None = None
    low_watermark: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_deliveries, bool) or not isinstance(self.max_deliveries, int) or self.max_deliveries < 1:
            raise ValueError(f"max_deliveries must be an int >= 1, got {self.max_deliveries!r}")
        if self.sample_bytes < 1:
            raise ValueError(f"sample_bytes must be >= 1, got {self.sample_bytes!r}")


@dataclasses.dataclass(frozen=True)
class TraceResult:
    """The verdict on one trace: ``admitted``, how many spec steps matched, the first unmatched event."""

    admitted: bool
    matched_steps: int
    total_steps: int
    stuck_at: Mapping[str, object] | None
    tlc: TLCResult

    def explain(self) -> str:
        if self.admitted:
            return f"trace admitted by the spec ({self.total_steps} steps)"
        return (
            f"trace REJECTED: the spec admits the first {self.matched_steps} of {self.total_steps} steps; "
            f"no spec action matches step {self.matched_steps + 1}: {self.stuck_at}"
        )


class TraceRecorder:
    """A queue ``tracer``: records ``(action, fields)`` pairs, thread-safe.

    ``observe_residency(store)`` appends a ``Resident`` event listing which
    samples put so far are resident; call it between operations (it reads the
    store's ``is_resident``), e.g. after every step of a single-threaded test.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[Event] = []
        self._samples: dict[str, None] = {}

    def __call__(self, action: str, fields: Mapping[str, object]) -> None:
        with self._lock:
            self.events.append((action, dict(fields)))
            sample = fields.get("sample_id")
            if action == "Put" and isinstance(sample, str):
                self._samples[sample] = None

    def observe_residency(self, store: FeatureStore) -> None:
        with self._lock:
            resident = sorted(s for s in self._samples if store.is_resident(s))
            self.events.append(("Resident", {"samples": resident}))


@dataclasses.dataclass(frozen=True)
class _Step:
    action: str
    sample: str = ""
    lease: int = 0
    outcome: str = ""
    observed: tuple[str, ...] = ()
    source: Mapping[str, object] | None = None


def _steps(events: Iterable[Event], sample_bytes: int) -> list[_Step]:
    """Events -> spec steps: insert StorePut, fold DeadLetter into its Fail/Reclaim.

    A sample's StorePut goes right before its first Put, or earlier when a
    Pause/Resume reports more resident bytes than the samples stored so far:
    producers write the store before they wait on backpressure to enqueue.
    """
    events = list(events)
    steps: list[_Step] = []
    stored: set[str] = set()
    settled: set[str] = set()
    first_puts = list(dict.fromkeys(str(f.get("sample_id", "")) for a, f in events if a == "Put"))
    # Leases become consumers 1..n of this trace: small, dense domains keep TLC's states small.
    consumer_of: dict[object, int] = {}
    skip_next = False
    for index, (action, fields) in enumerate(events):
        if skip_next:
            skip_next = False
            continue
        if action not in _KNOWN:
            raise ValueError(f"trace event {index} has unknown action {action!r}; known: {sorted(_KNOWN)}")
        sample = str(fields.get("sample_id", ""))
        lease = fields.get("lease_id")
        if action == "Acquire" and lease is not None:
            consumer_of.setdefault(lease, len(consumer_of) + 1)
        lease_id = consumer_of.get(lease, -1)
        source = {"index": index, "action": action, **fields}
        if action == "Put" and sample not in stored:
            stored.add(sample)
            steps.append(_Step("StorePut", sample, source=source))
        if action in ("Pause", "Resume") and isinstance(fields.get("resident_bytes"), int):
            missing = int(fields["resident_bytes"]) // sample_bytes - len(stored - settled)  # type: ignore[call-overload]
            for early in [s for s in first_puts if s not in stored][: max(missing, 0)]:
                stored.add(early)
                steps.append(_Step("StorePut", early, source=source))
        if action in ("Ack", "DeadLetter"):
            settled.add(sample)
        if action in ("Fail", "Reclaim"):
            following = events[index + 1] if index + 1 < len(events) else None
            dead = following is not None and following[0] == "DeadLetter" and following[1].get("sample_id") == sample
            skip_next = dead
            if dead:
                settled.add(sample)
            steps.append(_Step(action, sample, lease_id, "dead" if dead else "pending", source=source))
        elif action == "StaleRejected":
            steps.append(_Step(action, lease=lease_id, outcome=str(fields.get("op", "")), source=source))
        elif action == "Resident":
            observed = fields.get("samples", ())
            steps.append(_Step(action, observed=tuple(sorted(map(str, observed))), source=source))  # type: ignore[call-overload]
        else:
            steps.append(_Step(action, sample, lease_id, source=source))
    return steps


def _tla_string(value: str) -> str:
    return json.dumps(value)  # TLA+ string literals share JSON's escapes for the characters ids use


def _record(step: _Step) -> str:
    observed = ", ".join(_tla_string(s) for s in step.observed)
    return (
        f'[a |-> "{step.action}", s |-> {_tla_string(step.sample)}, l |-> {step.lease}, '
        f"o |-> {_tla_string(step.outcome)}, obs |-> {{{observed}}}]"
    )


_TRACE_MODULE = """---- MODULE LeaseQueueTrace ----
(* Generated by featurestream.spec.trace: {count} implementation trace(s) to validate against LeaseQueue. *)
EXTENDS LeaseQueue, Integers, Sequences

TraceSamples == {samples}
TraceConsumers == {consumers}
Log == <<
{log}
>>

VARIABLES tr, i

(* The event at the cursor, matched to the spec action it names. *)
Match(e) ==
    CASE e.a = "StorePut" -> StorePut(e.s)
      [] e.a = "Put" -> Put(e.s)
      [] e.a = "DedupRefused" -> Reput(e.s)
      [] e.a = "Acquire" -> e.l \\in Consumers /\\ queue # <<>> /\\ Head(queue) = e.s /\\ Acquire(e.l)
      [] e.a = "Ack" -> e.l \\in Consumers /\\ \\E t \\in held[e.l] :
                            t[1] = e.s /\\ CanFire("Ack", t[1], t[2]) /\\ Ack(e.l, t)
      [] e.a = "Fail" -> e.l \\in Consumers /\\ \\E t \\in held[e.l] :
                            t[1] = e.s /\\ CanFire("Fail", t[1], t[2]) /\\ Fail(e.l, t) /\\ status'[e.s] = e.o
      [] e.a = "Reclaim" -> e.l \\in Consumers /\\ <<e.s, deliveries[e.s]>> \\in held[e.l]
                            /\\ Reclaim(e.s) /\\ status'[e.s] = e.o
      [] e.a = "Extend" -> e.l \\in Consumers /\\ \\E t \\in held[e.l] :
                            t[1] = e.s /\\ CanFire("Extend", t[1], t[2]) /\\ Extend(e.l, t)
      [] e.a = "StaleRejected" -> UNCHANGED vars
      [] e.a = "Resident" -> {{s \\in resident : status[s] # "stored"}} = e.obs /\\ UNCHANGED vars
      [] e.a = "Pause" -> Pause
      [] e.a = "Resume" -> Resume
      [] e.a = "Close" -> Close
      [] e.a = "Drain" -> Drain
      [] OTHER -> FALSE

TraceInit == tr \\in 1..Len(Log) /\\ i = 1 /\\ Init
TraceNext == i <= Len(Log[tr]) /\\ Match(Log[tr][i]) /\\ i' = i + 1 /\\ UNCHANGED tr
TraceSpec == TraceInit /\\ [][TraceNext]_<<vars, tr, i>>

(* Both "invariants" are reports: TraceMatched breaks when trace tr is fully consumed (admitted), *)
(* TraceStuck when no spec action matches event i of trace tr.                                   *)
TraceMatched == i <= Len(Log[tr])
TraceStuck == ~(i <= Len(Log[tr]) /\\ ~ENABLED TraceNext)
====
"""

_TRACE_CONFIG = """SPECIFICATION TraceSpec
CONSTANTS
    Samples <- TraceSamples
    Consumers <- TraceConsumers
    MaxDeliveries = {max_deliveries}
    HighWatermark = {high}
    LowWatermark = {low}
    MaxHeld = 1
    SampleBytes = {sample_bytes}
    BugStaleRelease = FALSE
    BugNoScrub = FALSE
    BugNoDedup = FALSE
    BugNoDeliveryLimit = FALSE
    BugNoReaper = FALSE
INVARIANTS
    TraceMatched
    TraceStuck
"""

_REPORT = re.compile(r"Error: Invariant (TraceMatched|TraceStuck) is violated\.(.*?)(?=Error: Invariant|\Z)", re.S)


def _last_value(block: str, name: str) -> int:
    values = re.findall(rf"/\\ {name} = (\d+)", block)
    return int(values[-1]) if values else 0


def validate_traces(
    traces: Sequence[Iterable[Event]], constants: TraceConstants, *, timeout: float | None = 600
) -> list[TraceResult]:
    """Validate every trace in one TLC run; one ``TraceResult`` per trace, in order.

    Raises ``ToolMissing`` without Java/TLC, ``ValueError`` for an unknown
    event, ``RuntimeError`` when TLC fails for a reason other than a verdict.
    """
    all_steps = [_steps(trace, constants.sample_bytes) for trace in traces]
    if not all_steps:
        return []
    samples = sorted({step.sample for steps in all_steps for step in steps if step.sample})
    consumers = max((step.lease for steps in all_steps for step in steps), default=0)
    empty = '[a |-> "End", s |-> "", l |-> 0, o |-> "", obs |-> {}]'
    log = ",\n".join(f"  <<{', '.join(map(_record, steps)) if steps else empty}>>" for steps in all_steps)
    module = _TRACE_MODULE.format(
        count=len(all_steps),
        samples="{" + ", ".join(map(_tla_string, samples or ["none"])) + "}",
        consumers=f"1..{max(consumers, 1)}",
        log=log,
    )
    high = constants.high_watermark if constants.high_watermark is not None else 1 << 30
    low = constants.low_watermark if constants.low_watermark is not None else 0
    config = _TRACE_CONFIG.format(
        max_deliveries=constants.max_deliveries, high=high, low=low, sample_bytes=constants.sample_bytes
    )
    with tempfile.TemporaryDirectory(prefix="featurestream-trace-") as scratch:
        module_path = Path(scratch) / "LeaseQueueTrace.tla"
        module_path.write_text(module)
        config_path = Path(scratch) / "trace.cfg"
        config_path.write_text(config)
        result = run_tlc(
            config_path,
            modules=[module_path],
            main_module=module_path.name,
            workers=1,
            timeout=timeout,
            extra_args=["-continue"],
        )
    reports = _REPORT.findall(result.output)
    if not reports and not result.ok:
        raise RuntimeError(f"TLC failed on the trace module: {result.error}\n{result.output[-3000:]}")
    admitted: set[int] = set()
    furthest: dict[int, int] = {}
    for name, block in reports:
        tr, i = _last_value(block, "tr"), _last_value(block, "i")
        if name == "TraceMatched":
            admitted.add(tr)
        else:
            furthest[tr] = max(furthest.get(tr, 0), i)
    verdicts = []
    for number, steps in enumerate(all_steps, start=1):
        if number in admitted or not steps:
            verdicts.append(TraceResult(True, len(steps), len(steps), None, result))
            continue
        at = furthest.get(number, 1)
        verdicts.append(TraceResult(False, at - 1, len(steps), steps[at - 1].source, result))
    return verdicts


def validate_trace(events: Iterable[Event], constants: TraceConstants, *, timeout: float | None = 600) -> TraceResult:
    """Validate one trace (see ``validate_traces``)."""
    return validate_traces([events], constants, timeout=timeout)[0]
