"""Redis scaling benchmark: samples/s with 1, 2, 4 consumer processes over one queue, and the server's CPU per sample.

    python benchmarks/bench_redis_scaling.py [--samples 4000] [--rounds 3] [--url redis://HOST:PORT/DB]

Without ``--url`` it starts its own ``redis-server`` (see ``bench_redis.py``).
Each measurement pre-fills one fresh queue with ``--samples`` refs (``put_many``,
not timed) and closes it, then releases ``k`` consumer processes at once; each
leases and acks until the queue is drained: one by one (``acquire`` + ``ack``,
two round trips per sample) and in batches of 32 (``acquire_many`` +
``ack_many``). Consumers are other processes than the producer, so every ref
is decoded from the wire. Reported, medians over ``--rounds``: samples/s (from
the release to the last consumer's drained return, read on the system-wide
monotonic clock), the speed-up over one consumer, and
the server's CPU per sample (``INFO cpu``: used_cpu_user + used_cpu_sys of the
server process) next to its ``FCALL`` time (``INFO commandstats``). On a machine
with few cores the consumers, the server and everything else share them: read
the speed-up against the core count printed first.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
import uuid
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

import redis
from bench_redis import NullStore, make_ref, redis_server

from featurestream.backends.redis.queue import RedisSampleRefQueue

CONSUMERS = (1, 2, 4)
BATCH = 32


def consume(url: str, name: str, batch: int, ready: Event, start: Event, finished: Queue) -> None:
    """Lease and ack until the queue is drained (``batch`` 1: one by one); report when it finished."""
    queue = RedisSampleRefQueue(NullStore(), url=url, name=name)
    ready.set()
    start.wait()
    while True:
        if batch == 1:
            lease = queue.acquire(timeout=0.05)
            leases = [] if lease is None else [lease]
        else:
            leases = queue.acquire_many(batch, timeout=0.05)
        if not leases:
            if queue.lifecycle_state == "drained":
                break
            continue
        if batch == 1:
            queue.ack(leases[0])
        else:
            queue.ack_many(leases)
    # time.monotonic is the system-wide monotonic clock: comparable with the parent's (process exit not counted).
    finished.put(time.monotonic())
    queue.disconnect()


def server_cpu(admin: redis.Redis) -> tuple[float, int]:
    """(server CPU seconds, FCALL usec) since it started."""
    cpu = admin.info("cpu")
    fcall = admin.info("commandstats").get("cmdstat_fcall", {}).get("usec", 0)
    return cpu["used_cpu_user"] + cpu["used_cpu_sys"], int(fcall)


def measure(url: str, admin: redis.Redis, samples: int, consumers: int, batch: int) -> tuple[float, float, float]:
    """(samples/s, server CPU us/sample, server FCALL us/sample) of one run."""
    name = f"scale-{uuid.uuid4().hex}"
    producer = RedisSampleRefQueue(NullStore(), url=url, name=name)
    refs = [make_ref(n) for n in range(samples)]
    for first in range(0, samples, 500):
        producer.put_many(refs[first : first + 500])
    producer.close()
    context = multiprocessing.get_context("spawn")
    start, finished = context.Event(), context.Queue()
    readies = [context.Event() for _ in range(consumers)]
    workers = [context.Process(target=consume, args=(url, name, batch, ready, start, finished)) for ready in readies]
    for worker in workers:
        worker.start()
    for ready in readies:
        if not ready.wait(120):
            raise RuntimeError("a consumer process did not start")
    cpu_before, fcall_before = server_cpu(admin)
    started = time.monotonic()
    start.set()
    ends = [finished.get(timeout=600) for _ in workers]
    cpu_after, fcall_after = server_cpu(admin)
    elapsed = max(ends) - started
    for worker in workers:
        worker.join(600)
        if worker.exitcode != 0:
            raise RuntimeError(f"a consumer process failed with exit code {worker.exitcode}")
    stats = producer.stats()
    assert stats.acked == samples and producer.lifecycle_state == "drained", stats
    producer.disconnect()
    return samples / elapsed, (cpu_after - cpu_before) / samples * 1e6, (fcall_after - fcall_before) / samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=4000, help="samples per measurement (default 4000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per configuration (default 3)")
    parser.add_argument("--url", default=None, help="an existing server (default: start a private redis-server)")
    args = parser.parse_args()
    with redis_server(args.url) as url:
        admin = redis.Redis.from_url(url)
        print(f"redis-server {admin.info('server')['redis_version']}; {os.cpu_count()} cores; "
              f"{args.samples} samples per run, {args.rounds} rounds")  # fmt: skip
        for batch in (1, BATCH):
            print(f"\n[{'one by one' if batch == 1 else f'batches of {batch}'}]")
            base = None
            for consumers in CONSUMERS:
                runs = [measure(url, admin, args.samples, consumers, batch) for _ in range(args.rounds)]
                rate = statistics.median(run[0] for run in runs)
                base = base or rate
                cpu = statistics.median(run[1] for run in runs)
                fcall = statistics.median(run[2] for run in runs)
                print(
                    f"  {consumers} consumer process{'es' if consumers > 1 else '  '}: {rate:8.0f} samples/s "
                    f"({rate / base:.2f}x one)  server CPU {cpu:6.1f} us/sample, FCALL time {fcall:6.1f} us/sample"
                )
        admin.close()


if __name__ == "__main__":
    main()
