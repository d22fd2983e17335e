"""Control-plane benchmark: cost per sample lifecycle at depth, and put-to-lease wake-up latency.

    python benchmarks/bench_queue.py [--depths 1000,100000,1000000] [--ops 20000] [--cpu-time]

Every number is printed next to baselines measured in the same run: the
installed reference package's ``SampleRefQueue`` (cost and latency; its
column is skipped when ``nemo-automodel`` is not installed), a plain
``collections.deque`` + dict queue doing the same bookkeeping without the
state machine (cost), and CPython's ``queue.Queue`` hand-off (latency). The
reference's consumer polls (``acquire(poll_interval=0.05)``, what its loader
calls), so its latency is measured over ``--reference-latency-samples``.
The cost table also splits featurestream's lifecycle into the ``transitions``
triggers it fires (``lease`` then ``ack`` on the lease machine, timed alone on
fresh models) and everything around them (lock, FIFO, heap, counters, store
hooks): the part the queue itself controls. ``--cpu-time`` times the cost
table by this process's CPU time instead of the wall clock: on a loaded
machine the wall clock also counts time spent waiting for a core, which
swamps a few microseconds of difference (the wake-up latencies stay wall time).
"""

from __future__ import annotations

import argparse
import collections
import heapq
import itertools
import queue as stdlib_queue
import statistics
import threading
import time
import types
from collections.abc import Callable, Mapping
from typing import Protocol

import reference_baseline
import torch

import featurestream
from featurestream import FeatureStore, SampleRef, SampleRefQueue, StoreHandle, StoreHealth
from featurestream.core.machines import LEASE, LEASE_MACHINE, fire

_FEATURES = ("aux_hidden_states", "input_ids", "attention_mask", "loss_mask", "logits")
_KEYS = {name: name for name in _FEATURES}
_HEALTH = StoreHealth(0, 0, 0, False, True)


class NullStore(FeatureStore):
    """Holds nothing: isolates the control plane's own cost."""

    store_uri = "null://bench"

    def put(self, sample_id: str, tensors: Mapping[str, torch.Tensor], **_: object) -> SampleRef:
        raise NotImplementedError("the control-plane benchmark moves refs only")

    def get(self, ref: SampleRef, device: object = None) -> tuple[dict[str, torch.Tensor], StoreHandle]:
        raise NotImplementedError("the control-plane benchmark moves refs only")

    def release(self, handle: StoreHandle) -> None:
        pass

    def gc(self) -> int:
        return 0

    def health(self) -> StoreHealth:
        return _HEALTH

    def close(self) -> None:
        pass


def make_refs(prefix: str, count: int, api: types.ModuleType = featurestream) -> list[SampleRef]:
    """``count`` refs made with ``api``'s ``SampleRef`` (featurestream's, or the reference's streaming package)."""
    specs = {name: api.FeatureSpec((1,), torch.long) for name in _FEATURES}
    algorithm = api.FeatureAlgorithm.EAGLE3
    return [
        api.SampleRef(f"{prefix}{i}", "bench", NullStore.store_uri, _KEYS, specs, algorithm, 1, 1, 32, "0", "0")
        for i in range(count)
    ]


class _Lifecycle(Protocol):
    def put(self, ref: SampleRef) -> None: ...
    def acquire(self, poll_interval: float = ...) -> object: ...
    def ack(self, lease: object) -> None: ...


class BaselineQueue:
    """The same bookkeeping (FIFO, held ids, live leases, deadline heap) with no machine and no lock."""

    def __init__(self, visibility: float = 30.0) -> None:
        self._pending: collections.deque[SampleRef] = collections.deque()
        self._held: dict[str, SampleRef] = {}
        self._live: dict[int, tuple[SampleRef, float]] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._ids = itertools.count()
        self._visibility = visibility

    def put(self, ref: SampleRef) -> None:
        self._held[ref.sample_id] = ref
        self._pending.append(ref)

    def acquire(self, poll_interval: float = 0.0) -> int:
        ref = self._pending.popleft()
        lease_id = next(self._ids)
        deadline = time.monotonic() + self._visibility
        self._live[lease_id] = (ref, deadline)
        heapq.heappush(self._deadlines, (deadline, lease_id))
        return lease_id

    def ack(self, lease: object) -> None:
        ref, _ = self._live.pop(lease)  # type: ignore[call-overload]
        del self._held[ref.sample_id]


def lifecycle_cost(
    factory: Callable[[], _Lifecycle],
    prefill: list[SampleRef],
    ops: list[SampleRef],
    timer: Callable[[], float] = time.perf_counter,
) -> float:
    """Seconds (by ``timer``) per put + acquire + ack with ``len(prefill)`` samples pending."""
    queue = factory()
    for ref in prefill:
        queue.put(ref)
    start = timer()
    for ref in ops:
        queue.put(ref)
        queue.ack(queue.acquire(poll_interval=0))
    return (timer() - start) / len(ops)


class _Model:
    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = LEASE.initial


def trigger_cost(ops: int, timer: Callable[[], float] = time.perf_counter) -> float:
    """Seconds (by ``timer``) per lifecycle spent in the ``transitions`` triggers alone (``lease`` + ``ack``)."""
    models = [_Model() for _ in range(ops)]
    start = timer()
    for model in models:
        fire(LEASE_MACHINE, "lease", model)
        fire(LEASE_MACHINE, "ack", model)
    elapsed = timer() - start
    assert all(model.state == "acked" for model in models)
    return elapsed / ops


def wakeup_latencies(put: Callable[[int], None], get: Callable[[], object], samples: int) -> list[float]:
    """Seconds from ``put`` to a blocked consumer's ``get`` returning, one sample at a time."""
    stamps: list[float] = []
    ready = threading.Event()

    def consume() -> None:
        for _ in range(samples):
            ready.set()
            get()
            stamps.append(time.perf_counter())

    thread = threading.Thread(target=consume)
    thread.start()
    latencies = []
    for i in range(samples):
        ready.wait()
        ready.clear()
        time.sleep(0.002)  # make sure the consumer is parked in its wait
        sent = time.perf_counter()
        put(i)
        while len(stamps) <= i:
            time.sleep(0)
        latencies.append(stamps[i] - sent)
    thread.join()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="1000,100000,1000000")
    parser.add_argument("--ops", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency-samples", type=int, default=300)
    parser.add_argument("--reference-latency-samples", type=int, default=60)
    parser.add_argument("--cpu-time", action="store_true", help="time the cost table in process CPU time")
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    timer = time.process_time if args.cpu_time else time.perf_counter
    reference = reference_baseline.streaming()

    clock = "CPU time" if args.cpu_time else "wall time"
    print(f"control plane: cost per lifecycle (put + acquire + ack), best of {args.repeats}, {args.ops} ops, {clock}")
    print(
        f"{'pending':>10} {'featurestream':>15} {'triggers':>10} {'rest':>10} {'deque+dict':>12} "
        f"{'ratio':>7} {'rest ratio':>11} {'vs first depth':>15} {'reference':>12} {'fs/ref':>7} {'ref vs first':>13}"
    )
    ops = make_refs("op", args.ops)
    if reference is not None:
        reference_ops = make_refs("op", args.ops, reference)
    first = reference_first = None
    store = NullStore()
    for depth in depths:
        prefill = make_refs("pre", depth)
        ours = min(lifecycle_cost(lambda: SampleRefQueue(store), prefill, ops, timer) for _ in range(args.repeats))
        base = min(lifecycle_cost(BaselineQueue, prefill, ops, timer) for _ in range(args.repeats))
        triggers = min(trigger_cost(args.ops, timer) for _ in range(args.repeats))
        rest = ours - triggers
        first = first or ours
        line = (
            f"{depth:>10} {ours * 1e6:>12.2f} us {triggers * 1e6:>7.2f} us {rest * 1e6:>7.2f} us "
            f"{base * 1e6:>9.2f} us {ours / base:>6.1f}x {rest / base:>10.1f}x {ours / first:>14.2f}x"
        )
        del prefill
        if reference is not None:
            reference_prefill = make_refs("pre", depth, reference)
            theirs = min(
                lifecycle_cost(lambda: reference.SampleRefQueue(store), reference_prefill, reference_ops, timer)
                for _ in range(args.repeats)
            )
            del reference_prefill
            reference_first = reference_first or theirs
            line += f" {theirs * 1e6:>9.2f} us {ours / theirs:>6.2f}x {theirs / reference_first:>12.2f}x"
        print(line)

    print(f"\nwake-up: put -> lease of a consumer blocked in acquire(timeout=...), {args.latency_samples} samples")
    fs_queue = SampleRefQueue(store)
    refs = make_refs("wake", args.latency_samples)
    ours_lat = wakeup_latencies(lambda i: fs_queue.put(refs[i]), lambda: fs_queue.acquire(timeout=10), len(refs))
    std: stdlib_queue.Queue[int] = stdlib_queue.Queue()
    base_lat = wakeup_latencies(std.put, lambda: std.get(timeout=10), len(refs))
    measured = [("featurestream", ours_lat), ("queue.Queue", base_lat)]
    if reference is not None:
        ref_queue = reference.SampleRefQueue(store)
        ref_refs = make_refs("wake", args.reference_latency_samples, reference)
        measured.append(
            (
                "reference",
                wakeup_latencies(lambda i: ref_queue.put(ref_refs[i]), lambda: _poll(ref_queue), len(ref_refs)),
            )
        )
    for name, lat in measured:
        ordered = sorted(lat)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        print(f"{name:>14}: median {statistics.median(lat) * 1e3:.3f} ms  p99 {p99 * 1e3:.3f} ms ({len(lat)} samples)")
    for name, lat in measured[1:]:
        print(f"median ratio featurestream / {name}: {statistics.median(ours_lat) / statistics.median(lat):.3f}x")


def _poll(queue: object) -> object:
    """The reference consumer's wait: ``acquire`` with its default poll interval until a lease comes back."""
    while True:
        lease = queue.acquire(poll_interval=0.05)  # type: ignore[attr-defined]
        if lease is not None:
            return lease


if __name__ == "__main__":
    main()
