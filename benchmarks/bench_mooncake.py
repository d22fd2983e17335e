"""Producer -> trainer GB/s across processes: featurestream over Mooncake vs a raw Mooncake loop vs shared-dir.

    python benchmarks/bench_mooncake.py [--samples N] [--sizes 24,48] [--rounds R] [--redis URL]

It starts its own ``mooncake_master`` (127.0.0.1, free ports) and, without
``--redis``, its own ``redis-server``. Each round, for each sample size (MiB of
bf16 hidden states per EAGLE-3 sample), runs in separate producer and trainer
processes:

- ``raw``: the producer ``put_from``s each sample from one registered buffer
  (hard-pinned, into its own segment) and sends the key over a pipe; the
  trainer ``get_into``s it into one registered buffer and removes it. At most
  ``--window`` samples are in flight, the producer waits for the trainer's
  acknowledgement beyond that.
- ``featurestream``: ``MooncakeFeatureStore.put`` + ``RedisSampleRefQueue.put_blocks_until_below``
  (the watermarks allow the same window), and a ``FeatureDataLoader`` in the
  trainer: lease, ``get``, ack (the queue's scrub removes the object).
- ``shared-dir``: the same featurestream pipeline over ``SharedDirFeatureStore``
  in a temporary directory (``/dev/shm`` when there is one).

GB/s is the bytes of every sample divided by the time from the producer's first
put to the trainer's last sample; the medians of the rounds and the ratios to
the raw loop of the same round are printed.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_redis import redis_server
from pair import run_pair

from featurestream import FeatureDataLoader, MooncakeFeatureStore, SharedDirFeatureStore
from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.tools.mooncake import MooncakeMaster

TOKENS = 2048
SEGMENT = 1 << 30


def sample(index: int, mib: int) -> dict[str, torch.Tensor]:
    hidden = mib * (1 << 20) // (2 * TOKENS)
    return {
        "aux_hidden_states": torch.full((1, TOKENS, hidden), float(index % 7), dtype=torch.bfloat16),
        "input_ids": torch.arange(TOKENS).reshape(1, TOKENS),
        "attention_mask": torch.ones(1, TOKENS, dtype=torch.int64),
        "loss_mask": torch.ones(1, TOKENS, dtype=torch.int64),
        "logits": torch.zeros(1, TOKENS, 8, dtype=torch.bfloat16),
    }


def nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _client(master: dict[str, str], segment: int) -> Any:
    from mooncake.store import MooncakeDistributedStore

    client = MooncakeDistributedStore()
    rc = client.setup("127.0.0.1", master["metadata_server"], segment, 64 << 20, "tcp", "", master["address"])
    if rc != 0:
        raise RuntimeError(f"Mooncake setup failed: {rc}")
    return client


# -- raw loop ---------------------------------------------------------------------
def raw_producer(master: dict[str, str], mib: int, count: int, window: int, peer: Any, result: Any) -> None:
    from mooncake.store import ReplicateConfig

    client = _client(master, SEGMENT)
    size = nbytes(sample(0, mib))
    buffer = torch.ones(size, dtype=torch.uint8)
    client.register_buffer(buffer.data_ptr(), size)
    config = ReplicateConfig()
    config.with_hard_pin = True
    peer.recv()  # the trainer is ready
    started = time.perf_counter()
    in_flight = 0
    for index in range(count):
        if in_flight == window:
            peer.recv()
            in_flight -= 1
        key = f"{master['namespace']}/raw-{index}"
        if client.put_from(key, buffer.data_ptr(), size, config) != 0:
            raise RuntimeError(f"put_from {key} failed")
        peer.send(key)
        in_flight += 1
    peer.send(started)
    while peer.recv() != "done":
        pass
    client.close()


def raw_trainer(master: dict[str, str], mib: int, peer: Any, result: Any) -> None:
    client = _client(master, 0)
    size = nbytes(sample(0, mib))
    buffer = torch.empty(size, dtype=torch.uint8)
    client.register_buffer(buffer.data_ptr(), size)
    peer.send("ready")
    while isinstance(key := peer.recv(), str):
        if client.get_into(key, buffer.data_ptr(), size) != size:
            raise RuntimeError(f"get_into {key} failed")
        client.remove(key, True)
        finished = time.perf_counter()
        peer.send("ack")
    result.put(finished - key)  # the last message is the producer's start time
    peer.send("done")
    client.close()


# -- featurestream ----------------------------------------------------------------
def _store(kind: str, master: dict[str, str], directory: str, producer: bool) -> Any:
    if kind == "mooncake":
        return MooncakeFeatureStore(
            master_server_address=master["address"], metadata_server=master["metadata_server"],
            local_hostname="127.0.0.1", global_segment_size=SEGMENT if producer else 0,
            namespace=master["namespace"], max_samples=None, max_bytes=SEGMENT,
        )  # fmt: skip
    return SharedDirFeatureStore(directory, max_samples=None, max_bytes=SEGMENT)


def _queue(store: Any, url: str, name: str, sample_bytes: int, window: int) -> RedisSampleRefQueue:
    # Pause once ``window`` samples are resident, resume when one has gone: the raw loop's window.
    return RedisSampleRefQueue(
        store, url=url, name=name, high_watermark_bytes=window * sample_bytes,
        low_watermark_bytes=(window - 1) * sample_bytes,
    )  # fmt: skip


def fs_producer(run: dict[str, Any], mib: int, count: int, window: int, peer: Any, result: Any) -> None:
    store = _store(run["store"], run["master"], run["directory"], True)
    tensors = [sample(i, mib) for i in range(window + 1)]
    queue = _queue(store, run["url"], run["name"], nbytes(tensors[0]), window)
    peer.recv()
    started = time.perf_counter()
    for index in range(count):
        ref = store.put(f"s{index}", tensors[index % len(tensors)], take_ownership=False)
        queue.put_blocks_until_below(ref, poll_interval=0.001)
    queue.close()
    peer.send(started)
    peer.recv()  # the trainer is done: closing the store earlier would take the samples with it
    store.close()
    queue.disconnect()


def fs_trainer(run: dict[str, Any], mib: int, peer: Any, result: Any) -> None:
    store = _store(run["store"], run["master"], run["directory"], False)
    queue = _queue(store, run["url"], run["name"], nbytes(sample(0, mib)), 2)
    peer.send("ready")
    with FeatureDataLoader(queue, store, prefetch=2) as loader:
        for _ in loader:
            pass
    finished = time.perf_counter()
    result.put(finished - peer.recv())
    peer.send("done")
    store.close()


def one_run(kind: str, run: dict[str, Any], mib: int, count: int, window: int) -> float:
    """Seconds from the producer's first put to the trainer's last sample, in two fresh processes."""
    ctx = mp.get_context("spawn")
    producer_end, trainer_end = ctx.Pipe()
    result = ctx.Queue()
    if kind == "raw":
        producer = ctx.Process(target=raw_producer, args=(run["master"], mib, count, window, producer_end, result))
        trainer = ctx.Process(target=raw_trainer, args=(run["master"], mib, trainer_end, result))
    else:
        producer = ctx.Process(target=fs_producer, args=(run, mib, count, window, producer_end, result))
        trainer = ctx.Process(target=fs_trainer, args=(run, mib, trainer_end, result))
    return run_pair(kind, [producer, trainer], result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=16, help="samples per run (default 16)")
    parser.add_argument("--sizes", default="24,48", help="MiB of hidden states per sample (default 24,48)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per configuration; medians printed")
    parser.add_argument("--window", type=int, default=4, help="samples in flight (default 4)")
    parser.add_argument("--redis", default=None, help="an existing redis-server URL (default: start one)")
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    with (
        MooncakeMaster() as mc,
        redis_server(args.redis) as url,
        tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as directory,
    ):
        print(f"mooncake_master at {mc.master_server_address}, redis at {url}; {args.samples} samples per run")
        for mib in sizes:
            size = nbytes(sample(0, mib))
            results: dict[str, list[float]] = {"raw": [], "mooncake": [], "shared-dir": []}
            for _ in range(args.rounds):
                for kind in results:
                    run = {
                        "store": "mooncake" if kind != "shared-dir" else "shared-dir",
                        "master": {
                            "address": mc.master_server_address,
                            "metadata_server": mc.metadata_server,
                            "namespace": f"bench-{uuid.uuid4().hex[:8]}",
                        },
                        "directory": directory,
                        "url": url,
                        "name": f"bench-{uuid.uuid4().hex[:8]}",
                    }
                    seconds = one_run(kind, run, mib, args.samples, args.window)
                    results[kind].append(args.samples * size / 1e9 / seconds)
            raw = statistics.median(results["raw"])
            print(f"{mib} MiB samples ({size / (1 << 20):.1f} MiB each):")
            for kind, values in results.items():
                ratios = [v / r for v, r in zip(values, results["raw"], strict=True)]
                print(
                    f"  {kind:12s} {statistics.median(values):6.3f} GB/s  "
                    f"(x{statistics.median(ratios):.2f} the raw loop of the same round; raw median {raw:.3f})"
                )


if __name__ == "__main__":
    main()
