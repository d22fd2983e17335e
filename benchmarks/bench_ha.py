"""Replicated Redis benchmark: what acknowledged-means-replicated costs, and how long a failover takes.

    python benchmarks/bench_ha.py [--samples 2000] [--rounds 5] [--kills 5]

Starts its own servers on 127.0.0.1 (``featurestream.tools.redis_servers.ReplicatedRedis``: a primary, two
replicas, three sentinels with ``down-after-milliseconds`` 1000 and ``failover-timeout`` 2000; and one plain
``redis-server``), no persistence. One lifecycle is put + acquire + ack of one sample (40-byte samples in a
``LocalFeatureStore``: the control plane is what is measured). Side by side in one run, rounds alternating,
median per lifecycle:

- ``one server``: the plain server at a URL (the default, ``min_replicas=0``; the baseline);
- ``replicated, url``: the cluster's primary at a URL, ``min_replicas=0`` (the same client path; the primary
  streams every effect to two replicas);
- ``sentinel, min_replicas=0``: through Sentinel without waiting (redis-py's per-command path, as a Sentinel
  connection pool takes);
- ``sentinel, min_replicas=1``: through Sentinel, each call pipelined with the fence and ``WAIT 1``.

Wall time per lifecycle (and samples/s from it), this process's CPU time per lifecycle, both as a ratio to the
baseline. Then ``--kills`` times: SIGKILL the primary, time a put (``min_replicas=1``, retried by the queue)
from the kill to its return on the promoted replica, restart the old primary as a replica. Reports the median
and the worst.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from featurestream import LocalFeatureStore, SampleRef, VisibilityTimeout
from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.testing import sample_tensors
from featurestream.tools.redis_servers import RedisNode, ReplicatedRedis

Factory = Callable[[str], RedisSampleRefQueue]


def refs(store: LocalFeatureStore, first: int, count: int) -> list[SampleRef]:
    """``count`` tiny samples in ``store`` (40 bytes each: the control plane is what is measured)."""
    return [store.put(f"sample-{first + i}", sample_tensors(0)) for i in range(count)]


def lifecycles(queue: RedisSampleRefQueue, first: int, count: int) -> tuple[float, float]:
    """Run ``count`` one-by-one lifecycles; (wall seconds, CPU seconds) per lifecycle."""
    samples = refs(queue.store, first, count)  # type: ignore[arg-type]
    wall, cpu = time.perf_counter(), time.process_time()
    for ref in samples:
        queue.put(ref)
        lease = queue.acquire(timeout=0)
        assert lease is not None and queue.ack(lease)
    return (time.perf_counter() - wall) / count, (time.process_time() - cpu) / count


def measure(factories: dict[str, Factory], samples: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per lifecycle of each configuration, rounds alternating between them."""
    queues = {label: make(f"bench-{uuid.uuid4().hex}") for label, make in factories.items()}
    results: dict[str, list[tuple[float, float]]] = {label: [] for label in factories}
    try:
        for queue in queues.values():
            lifecycles(queue, (rounds + 1) * samples, 200)  # warm up: connections, the library, the interpreter
        for round_ in range(rounds):
            for label, queue in queues.items():
                results[label].append(lifecycles(queue, (round_ + 1) * samples, samples))
    finally:
        for queue in queues.values():
            queue.disconnect()
    return {
        label: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
        for label, runs in results.items()
    }


def _time_promotion(cluster: ReplicatedRedis, old: RedisNode, start: float, out: list[float]) -> None:
    try:
        cluster.wait_failover(old)
    except TimeoutError:  # the sentinels never agreed on another primary: printed as such
        out.append(float("nan"))
    else:
        out.append(time.perf_counter() - start)


def failovers(cluster: ReplicatedRedis, kills: int) -> list[float]:
    """Seconds from each primary SIGKILL to the return of a put sent right after it (``min_replicas=1``); also
    printed: when the sentinels agreed on the promoted replica (watched from another thread)."""
    store = LocalFeatureStore()
    queue = RedisSampleRefQueue(
        store,
        VisibilityTimeout(30.0),
        name=f"failover-{uuid.uuid4().hex}",
        sentinels=cluster.sentinel_addresses,
        service_name=cluster.service,
        min_replicas=1,
        reconnect_timeout=60.0,
    )
    times: list[float] = []
    try:
        for kill in range(kills):
            cluster.wait_healthy()
            before, after = refs(store, 2 * kill, 2)
            queue.put(before)  # connected to this primary
            promoted: list[float] = []
            start = time.perf_counter()
            old = cluster.kill_primary()
            watcher = threading.Thread(target=_time_promotion, args=(cluster, old, start, promoted))
            watcher.start()
            queue.put(after)
            times.append(time.perf_counter() - start)
            watcher.join()
            cluster.restart(old)
            print(
                f"  kill {kill + 1}: replica promoted after {promoted[0]:.2f} s, "
                f"first call returned after {times[-1]:.2f} s",
                flush=True,
            )
    finally:
        queue.disconnect()
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=2000, help="lifecycles per round and configuration")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kills", type=int, default=5)
    args = parser.parse_args(argv)
    logging.getLogger("featurestream.backends.redis.link").setLevel(logging.ERROR)  # the failovers' retry notes
    with tempfile.TemporaryDirectory(prefix="bench-ha-") as scratch:
        single = RedisNode(Path(scratch) / "single")
        (Path(scratch) / "single").mkdir()
        single.start()
        cluster = ReplicatedRedis(Path(scratch) / "cluster", replicas=2)
        try:
            cluster.start()
            sentinel = {"sentinels": cluster.sentinel_addresses, "service_name": cluster.service}
            primary_url = f"redis://127.0.0.1:{cluster.primary().port}/0"
            factories: dict[str, Factory] = {
                "one server": lambda name: RedisSampleRefQueue(
                    LocalFeatureStore(max_samples=None), url=f"redis://127.0.0.1:{single.port}/0", name=name
                ),
                "replicated, url": lambda name: RedisSampleRefQueue(
                    LocalFeatureStore(max_samples=None), url=primary_url, name=name
                ),
                "sentinel, min_replicas=0": lambda name: RedisSampleRefQueue(
                    LocalFeatureStore(max_samples=None), name=name, min_replicas=0, **sentinel
                ),
                "sentinel, min_replicas=1": lambda name: RedisSampleRefQueue(
                    LocalFeatureStore(max_samples=None), name=name, min_replicas=1, **sentinel
                ),
            }
            print(f"lifecycles (put + acquire + ack), {args.samples} per round, median of {args.rounds} rounds:")
            results = measure(factories, args.samples, args.rounds)
            base_wall, base_cpu = results["one server"]
            print(f"  {'configuration':26}{'wall us':>9}{'samples/s':>11}{'x':>7}{'CPU us':>9}{'x':>7}")
            for label, (wall, cpu) in results.items():
                print(
                    f"  {label:26}{wall * 1e6:9.1f}{1 / wall:11.0f}{wall / base_wall:7.2f}"
                    f"{cpu * 1e6:9.1f}{cpu / base_cpu:7.2f}"
                )
            if args.kills:
                print(f"failover: {args.kills} primary SIGKILLs (down-after 1000 ms, two replicas):")
                times = failovers(cluster, args.kills)
                print(f"  primary death to first successful call: median {statistics.median(times):.2f} s, "
                      f"worst {max(times):.2f} s")  # fmt: skip
        finally:
            cluster.stop()
            single.stop(kill=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
