"""Batched Redis benchmark: per-sample cost of put_many / acquire_many / ack_many at n = 1, 8, 32.

    python benchmarks/bench_redis_batch.py [--samples 3072] [--rounds 5] [--url redis://HOST:PORT/DB]

Without ``--url`` it starts its own ``redis-server`` (see ``bench_redis.py``).
One batch lifecycle is ``put_many(n)`` + ``acquire_many(n)`` + ``ack_many(n)``:
three round trips (three ``FCALL``s) for ``n`` samples. Baseline, in the same
run against the same server: the raw one-by-one ``XADD`` / ``XREADGROUP COUNT 1``
/ ``XACK`` loop of ``bench_redis.py`` (three round trips per sample). Rounds
alternate baseline and every ``n``; medians are reported, as ratios to the
baseline. Target: at n = 32, at most 0.25x the raw loop's cost per
sample. Uses the hiredis reply parser when installed.
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from functools import partial

import redis
from bench_redis import (
    PARSERS,
    RAW_COMMANDS,
    Measurement,
    NullStore,
    counting_client,
    make_ref,
    measure,
    raw_loop,
    redis_server,
)

from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.backends.redis.wire import ref_to_json
from featurestream.common.refs import SampleRef

BATCHES = (1, 8, 32)


def batch_loop(client: redis.Redis, refs: list[SampleRef], n: int) -> None:
    queue = RedisSampleRefQueue(NullStore(), client=client, name=f"bench-{uuid.uuid4().hex}")
    for start in range(0, len(refs), n):
        queue.put_many(refs[start : start + n])
        leases = queue.acquire_many(n, timeout=0)
        assert len(leases) == len(refs[start : start + n])
        queue.ack_many(leases)
    assert queue.stats().acked == len(refs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=3072, help="samples per measurement (default 3072)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--url", default=None, help="an existing server (default: start a private redis-server)")
    args = parser.parse_args()
    refs = [make_ref(n) for n in range(args.samples)]
    payloads = [ref_to_json(ref).encode() for ref in refs]
    parser_name = next(iter(PARSERS))
    with redis_server(args.url) as url:
        client, admin = counting_client(url, parser_name), redis.Redis.from_url(url)
        print(f"redis-server {admin.info('server')['redis_version']}; {args.samples} samples per round, "
              f"{args.rounds} rounds; {parser_name} parser")  # fmt: skip
        raws: list[Measurement] = []
        batched: dict[int, list[Measurement]] = {n: [] for n in BATCHES}
        for _ in range(args.rounds):
            raws.append(measure(admin, partial(raw_loop, client, payloads, False), len(refs), RAW_COMMANDS))
            for n in BATCHES:
                batched[n].append(measure(admin, partial(batch_loop, client, refs, n), len(refs), {"fcall"}))
        base = statistics.median(m.seconds for m in raws)
        print(f"  raw one-by-one loop      : {base * 1e6:7.1f} us/sample  (1.00x)  3.00 round trips/sample")
        for n, runs in batched.items():
            cost = statistics.median(m.seconds for m in runs)
            server = statistics.median(m.server_us for m in runs)
            target = f"  (target <= 0.25x: {'met' if cost / base <= 0.25 else 'MISSED'})" if n == 32 else ""
            print(
                f"  batches of {n:2d}            : {cost * 1e6:7.1f} us/sample  ({cost / base:.2f}x)  "
                f"{runs[-1].trips:.2f} round trips/sample, server {server:5.1f} us/sample{target}"
            )
        client.close()
        admin.close()


if __name__ == "__main__":
    main()
