"""Redis backend benchmark: cost and round trips per sample lifecycle against a raw redis-py Streams loop.

    python benchmarks/bench_redis.py [--samples 3000] [--rounds 5] [--url redis://HOST:PORT/DB]

Without ``--url`` it starts its own ``redis-server`` (127.0.0.1, a free port,
no persistence) and stops it at the end. One lifecycle is put + acquire + ack.
Baseline, measured in the same run against the same server: a raw loop of
``XADD`` (the same ref JSON as payload) / ``XREADGROUP COUNT 1`` / ``XACK`` on
one consumer group -- transport only, no lease, no reclaim, no dedup, no
decoding. Two shapes: ``deep`` (put all, then acquire + ack all: the queue is
``--samples`` deep) and ``one-by-one`` (put, acquire, ack per sample).

Round trips are counted on the client (every packed command written to a
socket is one request/reply exchange) and cross-checked with the server's
``INFO commandstats`` deltas (which also count the commands functions run).
Where the time goes: server time per sample (``INFO commandstats`` usec of the
commands the client sent: ``FCALL`` for the queue, the three stream commands
for the raw loop), the ``redis-server`` process's CPU time per sample (``INFO
cpu``, its network stack included) and this process's CPU time per sample
(``time.process_time``, redis-py included). Their sum, client plus server CPU,
is also reported as a ratio: on a loaded machine wall time mostly measures
waiting for a core, CPU time much less so. Needs Redis 7.0+ (the queue is a Redis Functions library).
Target: the queue's one-by-one cost per sample at most 1.3x the raw loop's.
Rounds alternate queue and baseline; the median per-sample time is reported.

Each comparison runs twice in the same process: with redis-py's hiredis reply
parser (``pip install hiredis``, the optional speed-up) and with its pure-Python
parser (``parser_class=_RESP2Parser``), both loops on the same parser.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import pathlib
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from functools import partial

import redis
import torch
from redis._parsers import _HiredisParser, _RESP2Parser
from redis.utils import HIREDIS_AVAILABLE

from featurestream import FeatureSpec, FeatureStore, SampleRef, StoreHandle, StoreHealth
from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.backends.redis.wire import ref_to_json

_SPECS = {
    "aux_hidden_states": FeatureSpec((1, 512, 3 * 4096), torch.bfloat16),
    "input_ids": FeatureSpec((1, 512), torch.int64),
    "attention_mask": FeatureSpec((1, 512), torch.int64),
    "loss_mask": FeatureSpec((1, 512), torch.int64),
    "logits": FeatureSpec((1, 512, 128_256), torch.bfloat16),
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


# redis-py's reply parsers: hiredis (C, optional) when installed, and the pure-Python one.
PARSERS: dict[str, type] = {**({"hiredis": _HiredisParser} if HIREDIS_AVAILABLE else {}), "python": _RESP2Parser}


def counting_client(url: str, parser: str = "python") -> redis.Redis:
    pool = redis.ConnectionPool.from_url(url, connection_class=CountingConnection, parser_class=PARSERS[parser])
    return redis.Redis(connection_pool=pool)


def server_cpu(admin: redis.Redis) -> float:
    """Seconds of CPU the ``redis-server`` process used since it started."""
    cpu = admin.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def command_stats(admin: redis.Redis) -> dict[str, tuple[int, int]]:
    """Command name -> (calls, usec) since the server started."""
    stats = admin.info("commandstats").items()
    return {name.removeprefix("cmdstat_"): (entry["calls"], entry["usec"]) for name, entry in stats}


@dataclasses.dataclass
class Measurement:
    """Per lifecycle: wall seconds, round trips, server commands (incl. inside functions), server and client us."""

    seconds: float
    trips: float
    commands: dict[str, float]
    server_us: float
    client_cpu_us: float
    server_cpu_us: float

    @property
    def cpu_us(self) -> float:
        """Client plus server CPU per lifecycle."""
        return self.client_cpu_us + self.server_cpu_us


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


def measure(admin: redis.Redis, run: Callable[[], None], lifecycles: int, top_level: set[str]) -> Measurement:
    """Run once; ``top_level`` names the commands the client sends (their usec is the server's time)."""
    sent, before, server_before = CountingConnection.sent, command_stats(admin), server_cpu(admin)
    started, cpu = time.perf_counter(), time.process_time()
    run()
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    server_cpu_us = (server_cpu(admin) - server_before) / lifecycles * 1e6
    trips = (CountingConnection.sent - sent) / lifecycles
    after = command_stats(admin)
    delta = {name: (calls - before.get(name, (0, 0))[0], usec - before.get(name, (0, 0))[1])
             for name, (calls, usec) in after.items()}  # fmt: skip
    commands = {name: calls / lifecycles for name, (calls, _) in delta.items() if calls}
    server_us = sum(usec for name, (_, usec) in delta.items() if name in top_level) / lifecycles
    return Measurement(elapsed / lifecycles, trips, commands, server_us, cpu / lifecycles * 1e6, server_cpu_us)


# -- a server of our own -------------------------------------------------------------
@contextlib.contextmanager
def redis_server(url: str | None) -> Iterator[str]:
    """``url``, or (``None``) a private ``redis-server`` on a free local port for the length of the block."""
    if url is not None:
        yield url
        return
    # Imported here: bench_ab's children import this module against older trees, which keep RedisNode elsewhere.
    from featurestream.tools.redis_servers import RedisNode

    with tempfile.TemporaryDirectory() as directory:
        try:
            server = RedisNode(pathlib.Path(directory))
        except FileNotFoundError as missing:  # no redis-server on PATH
            raise SystemExit(f"{missing}, or pass --url") from None
        with server:
            yield server.url


RAW_COMMANDS = {"xadd", "xreadgroup", "xack"}


def report(label: str, runs: list[Measurement]) -> None:
    """Print the medians of ``runs`` on one line."""
    cost = statistics.median(m.seconds for m in runs)
    server = statistics.median(m.server_us for m in runs)
    client = statistics.median(m.client_cpu_us for m in runs)
    server_cpu_us = statistics.median(m.server_cpu_us for m in runs)
    print(
        f"  {label:25s}: {cost * 1e6:8.1f} us/sample  {1 / cost:9.0f} samples/s  "
        f"{runs[-1].trips:.2f} round trips/sample  (server {server:6.1f} us, CPU: client {client:6.1f} us, "
        f"server {server_cpu_us:6.1f} us)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=3000, help="lifecycles per measurement (default 3000)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per shape (default 5)")
    parser.add_argument("--url", default=None, help="an existing server (default: start a private redis-server)")
    args = parser.parse_args()
    refs = [make_ref(n) for n in range(args.samples)]
    payloads = [ref_to_json(ref).encode() for ref in refs]
    with redis_server(args.url) as url:
        admin = redis.Redis.from_url(url)
        version = admin.info("server")["redis_version"]
        print(f"redis-server {version} at {url}; {args.samples} lifecycles (put + acquire + ack) per round, "
              f"{args.rounds} rounds; ref JSON {len(payloads[0])} B; parsers: {', '.join(PARSERS)}")  # fmt: skip
        for parser_name in PARSERS:
            client = counting_client(url, parser_name)
            for shape, deep in (("one-by-one", False), ("deep", True)):
                queues: list[Measurement] = []
                raws: list[Measurement] = []
                for _ in range(args.rounds):
                    queues.append(measure(admin, partial(queue_loop, client, refs, deep), len(refs), {"fcall"}))
                    raws.append(measure(admin, partial(raw_loop, client, payloads, deep), len(refs), RAW_COMMANDS))
                print(f"\n[{shape}, {parser_name} parser]")
                report("raw XADD/XREADGROUP/XACK", raws)
                report("RedisSampleRefQueue", queues)
                ratio = statistics.median(m.seconds for m in queues) / statistics.median(m.seconds for m in raws)
                verdict = "met" if ratio <= 1.3 else "MISSED"
                print(f"  ratio queue/raw          : {ratio:.2f}x  (target <= 1.3x: {verdict})")
                cpu = statistics.median(m.cpu_us for m in queues) / statistics.median(m.cpu_us for m in raws)
                print(f"  CPU ratio (client+server): {cpu:.2f}x")
                per = {name: round(n, 2) for name, n in sorted(queues[-1].commands.items()) if n >= 0.1}
                print(f"  server commands/sample (queue, INFO commandstats, incl. inside functions): {per}")
            client.close()
        admin.close()


if __name__ == "__main__":
    main()
