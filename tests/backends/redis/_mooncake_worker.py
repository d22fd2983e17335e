"""A producer or trainer process for the Mooncake cross-process tests (run as a script, not collected).

    python _mooncake_worker.py produce URL NAME MASTER METADATA NAMESPACE LOG COUNT [exit|hold]
    python _mooncake_worker.py train URL NAME MASTER METADATA NAMESPACE LOG

The producer hosts the bytes (a 256 MiB segment), puts samples ``s0..s{COUNT-1}``
through ``put_blocks_until_below``, closes the queue and closes its store, which
waits until the trainer acked every sample (``exit``: it logs ``queued`` and
waits to be SIGKILLed instead; ``hold``: it logs ``queued`` and closes its store
once a line arrives on stdin). The trainer (no segment) runs a
``FeatureDataLoader``, checks each sample's bytes, logs ``consumed <id>``; its
tracer logs ``Ack <id>`` and ``DeadLetter <id> <reason>`` for every ack and dead
letter the server recorded. Both log ``resident <count>`` at the end.
"""

from __future__ import annotations

import sys

import torch

from featurestream import FeatureDataLoader, MooncakeFeatureStore, VisibilityTimeout
from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.testing import sample_tensors

TOKENS = 64
VOCAB = 32


def tensors(index: int) -> dict[str, torch.Tensor]:
    """Sample ``index``: the kit's deterministic tensors plus bf16 logits drawn from a seed of ``index``."""
    out = sample_tensors(index, TOKENS)
    draw = torch.Generator().manual_seed(index)
    out["logits"] = torch.randn(1, TOKENS, VOCAB, generator=draw).to(torch.bfloat16)
    return out


SAMPLE_BYTES = sum(t.numel() * t.element_size() for t in tensors(0).values())


def open_queue(url: str, name: str, store: MooncakeFeatureStore, log: object) -> RedisSampleRefQueue:
    def tracer(action: str, fields: dict[str, object]) -> None:
        if action in ("Ack", "DeadLetter"):
            print(action, fields["sample_id"], file=log, flush=True)  # type: ignore[call-overload]

    return RedisSampleRefQueue(
        store, VisibilityTimeout(5.0), max_deliveries=3, high_watermark_bytes=8 * SAMPLE_BYTES,
        low_watermark_bytes=2 * SAMPLE_BYTES, url=url, name=name, tracer=tracer,
    )  # fmt: skip


def produce(queue: RedisSampleRefQueue, store: MooncakeFeatureStore, log: object, count: int, mode: str) -> None:
    for index in range(count):
        ref = store.put(f"s{index}", tensors(index))
        queue.put_blocks_until_below(ref, poll_interval=0.01)
    queue.close()
    if mode:
        print("queued", file=log, flush=True)  # type: ignore[call-overload]
        sys.stdin.readline()  # exit: SIGKILL comes; hold: the test says when
    store.close()  # waits until the trainer acked every sample: their bytes live in this process
    print("resident", store.health().sample_count, file=log, flush=True)  # type: ignore[call-overload]


def train(queue: RedisSampleRefQueue, store: MooncakeFeatureStore, log: object) -> None:
    with FeatureDataLoader(queue, store, prefetch=2) as loader:
        while True:
            try:
                batch = next(loader)
            except StopIteration:
                break
            except KeyError as exc:  # a lost sample: the loader dead-lettered it
                print("lost", exc.args[0], file=log, flush=True)  # type: ignore[call-overload]
                continue
            sample_id = loader.current_lease.ref.sample_id  # type: ignore[union-attr]
            expected = tensors(int(sample_id[1:]))
            if not all(torch.equal(getattr(batch, name), want) for name, want in expected.items()):
                raise AssertionError(f"{sample_id} materialised with the wrong bytes")
            print("consumed", sample_id, file=log, flush=True)  # type: ignore[call-overload]
    print("resident", store.health().sample_count, file=log, flush=True)  # type: ignore[call-overload]


def main(argv: list[str]) -> None:
    role, url, name, master, metadata, namespace, log_path, *rest = argv
    segment = 256 << 20 if role == "produce" else 0
    store = MooncakeFeatureStore(
        master_server_address=master, metadata_server=metadata, local_hostname="127.0.0.1",
        global_segment_size=segment, namespace=namespace, max_samples=None, max_bytes=1 << 30,
    )  # fmt: skip
    with open(log_path, "a") as log:
        queue = open_queue(url, name, store, log)
        if role == "produce":
            produce(queue, store, log, int(rest[0]), rest[1] if len(rest) > 1 else "")
        else:
            train(queue, store, log)
        queue.disconnect()


if __name__ == "__main__":
    main(sys.argv[1:])
