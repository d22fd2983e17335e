"""Redis backend benchmark: cost and round trips per sample lifecycle against a raw redis-py Streams loop.

    python benchmarks/bench_redis.py [--samples 5000] [--rounds 3] [--url redis://HOST:PORT/DB]

Without ``--url`` it starts its own ``redis-server`` (127.0.0.1, a free port,
no persistence) and stops it at the end. One lifecycle is put + acquire + ack.
Baseline, measured in the same run against the same server: a raw loop of
``XADD`` (the same ref JSON as payload) / ``XREADGROUP COUNT 1`` / ``XACK`` on
one consumer group -- transport only, no lease, no reclaim, no dedup, no
decoding. Two shapes: ``deep`` (put all, then acquire + ack all: the queue is
``--samples`` deep) and ``one-by-one`` (put, acquire, ack per sample).

Round trips are counted on the client (every packed command written to a
socket is one request/reply exchange) and cross-checked with the server's
``INFO commandstats`` deltas (which also count the commands scripts run).
Target (issue 6): the queue's cost per sample at most 1.5x the raw loop's.
Rounds alternate queue and baseline; the median per-sample time is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from functools import partial

import torch

import redis
from featurestream import FeatureSpec, FeatureStore, SampleRef, StoreHandle, StoreHealth
from featurestream.redis_queue import RedisSampleRefQueue
from featurestream.wire import ref_to_json

_SPECS = {
    "aux_hidden_states": FeatureSpec((1, 512, 3 * 4096), torch.bfloat16),
    "input_ids": FeatureSpec((1, 512), torch.int64),
    "attention_mask": FeatureSpec((1, 512), torch.int64),
    "loss_mask": FeatureSpec((1, 512), torch.int64),
}


class NullStore(FeatureStore):
    """Control plane only: refs without bytes; retain/scrub/gc are free."""

    store_uri = "bench://null"

    def put(self, sample_id: str, tensors: Mapping[str, torch.Tensor], **_: object) -> SampleRef:
        raise NotImplementedError

    def get(self, ref: SampleRef, device: object = None) -> tuple[dict[str, torch.Tensor], StoreHandle]:
        raise NotImplementedError

    def release(self, handle: StoreHandle) -> None:
        pass

    def gc(self) -> int:
        return 0

    def health(self) -> StoreHealth:
        return StoreHealth(0, 0, 0, False, True)

    def close(self) -> None:
        pass


def make_ref(n: int) -> SampleRef:
    return SampleRef(
        sample_id=f"sample-{n}",
        run_id="bench",
        store_uri=NullStore.store_uri,
        feature_keys={name: f"sample-{n}/{name}" for name in _SPECS},
        feature_specs=_SPECS,
        algorithm="eagle3",  # type: ignore[arg-type]
        schema_version=1,
        num_tokens=512,
        estimated_bytes=sum(spec.nbytes for spec in _SPECS.values()),
        target_model_version="target-1",
        draft_weight_version="draft-1",
    )


class CountingConnection(redis.Connection):
    """Counts request/reply exchanges: one per packed command (a pipeline is one)."""

    sent = 0

    def send_packed_command(self, command: object, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


def counting_client(url: str) -> redis.Redis:
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection)
    return redis.Redis(connection_pool=pool)


def command_calls(admin: redis.Redis) -> dict[str, int]:
    return {name.removeprefix("cmdstat_"): stats["calls"] for name, stats in admin.info("commandstats").items()}


# -- the two loops -------------------------------------------------------------------
def queue_loop(client: redis.Redis, refs: list[SampleRef], deep: bool) -> None:
    queue = RedisSampleRefQueue(NullStore(), client=client, name=f"bench-{uuid.uuid4().hex}")
    if deep:
        for ref in refs:
            queue.put(ref)
        for _ in refs:
            queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    else:
        for ref in refs:
            queue.put(ref)
            queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    assert queue.stats().acked == len(refs)


def raw_loop(client: redis.Redis, payloads: list[bytes], deep: bool) -> None:
    stream = f"raw-{uuid.uuid4().hex}"
    client.xgroup_create(stream, "g", id="$", mkstream=True)

    def take() -> None:
        [[_, [(entry_id, fields)]]] = client.xreadgroup("g", "c", {stream: ">"}, count=1)
        assert fields[b"ref"]
        client.xack(stream, "g", entry_id)

    if deep:
        for payload in payloads:
            client.xadd(stream, {"ref": payload})
        for _ in payloads:
            take()
    else:
        for payload in payloads:
            client.xadd(stream, {"ref": payload})
            take()
    client.delete(stream)


def measure(
    client: redis.Redis, admin: redis.Redis, run: Callable[[], None], lifecycles: int
) -> tuple[float, float, dict[str, int]]:
    """(seconds per lifecycle, round trips per lifecycle, server commands per lifecycle)."""
    sent, calls = CountingConnection.sent, command_calls(admin)
    started = time.perf_counter()
    run()
    elapsed = time.perf_counter() - started
    trips = (CountingConnection.sent - sent) / lifecycles
    after = command_calls(admin)
    per_command = {name: after[name] - calls.get(name, 0) for name in after if after[name] != calls.get(name, 0)}
    return elapsed / lifecycles, trips, per_command


# -- a server of our own -------------------------------------------------------------
@contextlib.contextmanager
def redis_server(url: str | None) -> Iterator[str]:
    if url is not None:
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH (apt-get install redis-server), or pass --url")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as directory:
        command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", directory, "--save", ""]
        process = subprocess.Popen([*command, "--appendonly", "no"], stdout=subprocess.DEVNULL)
        try:
            probe = redis.Redis(port=port)
            for _ in range(500):
                with contextlib.suppress(redis.ConnectionError):
                    if probe.ping():
                        break
                time.sleep(0.01)
            probe.close()
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            process.terminate()
            process.wait(timeout=15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=5000, help="lifecycles per measurement (default 5000)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per shape (default 3)")
    parser.add_argument("--url", default=None, help="an existing server (default: start a private redis-server)")
    args = parser.parse_args()
    refs = [make_ref(n) for n in range(args.samples)]
    payloads = [ref_to_json(ref).encode() for ref in refs]
    with redis_server(args.url) as url:
        client, admin = counting_client(url), redis.Redis.from_url(url)
        version = admin.info("server")["redis_version"]
        print(f"redis-server {version} at {url}; {args.samples} lifecycles (put + acquire + ack) per round, "
              f"{args.rounds} rounds; ref JSON {len(payloads[0])} B")  # fmt: skip
        for shape, deep in (("deep", True), ("one-by-one", False)):
            queue_times, raw_times = [], []
            for _ in range(args.rounds):
                q_time, q_trips, q_cmds = measure(client, admin, partial(queue_loop, client, refs, deep), len(refs))
                r_time, r_trips, r_cmds = measure(client, admin, partial(raw_loop, client, payloads, deep), len(refs))
                queue_times.append(q_time)
                raw_times.append(r_time)
            queue_cost, raw_cost = statistics.median(queue_times), statistics.median(raw_times)
            ratio = queue_cost / raw_cost
            print(f"\n[{shape}]")
            print(f"  raw XADD/XREADGROUP/XACK : {raw_cost * 1e6:8.1f} us/sample  {1 / raw_cost:9.0f} samples/s  "
                  f"{r_trips:.2f} round trips/sample")  # fmt: skip
            print(f"  RedisSampleRefQueue      : {queue_cost * 1e6:8.1f} us/sample  {1 / queue_cost:9.0f} samples/s  "
                  f"{q_trips:.2f} round trips/sample")  # fmt: skip
            print(f"  ratio queue/raw          : {ratio:.2f}x  (target <= 1.5x: {'met' if ratio <= 1.5 else 'MISSED'})")
            per = {name: round(n / len(refs), 2) for name, n in sorted(q_cmds.items()) if n >= len(refs) // 10}
            print(f"  server commands/sample (queue, INFO commandstats, incl. inside scripts): {per}")
            raw_per = {name: round(count / len(refs), 2) for name, count in sorted(r_cmds.items())}
            print(f"  server commands/sample (raw): {raw_per}")
        client.close()
        admin.close()


if __name__ == "__main__":
    main()
