"""A producer or consumer process for the multi-process fault test (run as a script, not collected).

    python _redis_worker.py produce URL NAME DIR LOG FIRST COUNT
    python _redis_worker.py consume URL NAME DIR LOG VICTIM_AFTER

Producers put samples ``{FIRST}..{FIRST+COUNT-1}`` through ``put_blocks_until_below``.
Consumers materialise each lease, check its bytes, log ``consumed <id>``, and
ack; their tracer logs ``Ack <id>`` for every ack the server accepted. A
consumer with ``VICTIM_AFTER >= 0`` stops after that many acks while holding
its next lease and handle (``holding <id>``) and waits to be SIGKILLed.
"""

from __future__ import annotations

import sys
import threading

import torch

from featurestream import SharedDirFeatureStore, VisibilityTimeout
from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.testing import sample_tensors

TOKENS = 4
VISIBILITY = 2.0
SAMPLE_BYTES = sum(t.numel() * t.element_size() for t in sample_tensors(0, TOKENS).values())


def sample_index(sample_id: str) -> int:
    return int(sample_id.removeprefix("s"))


def open_queue(url: str, name: str, directory: str, log: object) -> tuple[RedisSampleRefQueue, SharedDirFeatureStore]:
    store = SharedDirFeatureStore(directory, max_samples=None, max_bytes=1 << 30)

    def tracer(action: str, fields: dict[str, object]) -> None:
        if action == "Ack":
            print(f"Ack {fields['sample_id']}", file=log, flush=True)  # type: ignore[call-overload]

    queue = RedisSampleRefQueue(
        store, VisibilityTimeout(VISIBILITY), high_watermark_bytes=16 * SAMPLE_BYTES,
        low_watermark_bytes=4 * SAMPLE_BYTES, url=url, name=name, tracer=tracer, reconnect_timeout=60.0,
    )  # fmt: skip
    return queue, store


def produce(queue: RedisSampleRefQueue, store: SharedDirFeatureStore, first: int, count: int) -> None:
    for index in range(first, first + count):
        ref = store.put(f"s{index}", sample_tensors(index, TOKENS))
        queue.put_blocks_until_below(ref, poll_interval=0.01)


def consume(queue: RedisSampleRefQueue, store: SharedDirFeatureStore, log: object, victim_after: int) -> None:
    acked = 0
    while True:
        lease = queue.acquire(timeout=1.0)
        if lease is None:
            if queue.lifecycle_state == "drained":
                return
            continue
        tensors, handle = store.get(lease.ref)
        expected = sample_tensors(sample_index(lease.ref.sample_id), TOKENS)
        if not all(torch.equal(tensors[name], expected[name]) for name in expected):
            raise AssertionError(f"{lease.ref.sample_id} materialised with the wrong bytes")
        print(f"consumed {lease.ref.sample_id}", file=log, flush=True)  # type: ignore[call-overload]
        if acked == victim_after:
            print(f"holding {lease.ref.sample_id}", file=log, flush=True)  # type: ignore[call-overload]
            threading.Event().wait()  # mid-lease, handle out: SIGKILL comes
        threading.Event().wait(0.02)  # a training step
        store.release(handle)
        queue.ack(lease)
        acked += 1


def main(argv: list[str]) -> None:
    role, url, name, directory, log_path, *rest = argv
    with open(log_path, "a") as log:
        queue, store = open_queue(url, name, directory, log)
        if role == "produce":
            produce(queue, store, int(rest[0]), int(rest[1]))
        else:
            consume(queue, store, log, int(rest[0]))
        queue.disconnect()


if __name__ == "__main__":
    main(sys.argv[1:])
