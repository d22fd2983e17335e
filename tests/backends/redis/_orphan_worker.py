"""A producer process for the orphan-reclaim tests (run as a script, not collected).

    python _orphan_worker.py URL NAME DIR FIRST COUNT STOP_AT WHERE

Puts samples ``s{FIRST}..s{FIRST+COUNT-1}`` into a shared-directory store and a Redis queue
(``keep_dead_letter_bytes`` on, two deliveries). At sample ``s{STOP_AT}`` it prints ``stopped s<n>`` and waits to
be SIGKILLed, ``WHERE`` it is: ``stored`` (after ``store.put``, before ``queue.put``) or ``retained`` (inside
``queue.put``: the queued marker written, the enqueue not sent). ``STOP_AT`` -1: it puts them all, prints
``done`` and exits without closing its store. ``WHERE`` ``lease``: a trainer instead, which leases a sample (a
visibility timeout of a second), reads it, prints ``leased s<n>`` and waits to be SIGKILLed.
"""

from __future__ import annotations

import sys
import threading

from featurestream import SharedDirFeatureStore, VisibilityTimeout
from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.common.refs import SampleRef
from featurestream.testing import sample_tensors

TOKENS = 4
QUEUE_OPTIONS = {"max_deliveries": 2, "keep_dead_letter_bytes": 1 << 20}


def dead_letter(queue: RedisSampleRefQueue) -> str:
    """Fail the next sample until it is a dead letter (its bytes kept); its id."""
    while not queue.dead_letters():
        lease = queue.acquire(timeout=30)
        assert lease is not None and queue.fail(lease) is not None
    return queue.dead_letters()[-1].ref.sample_id


class StoppingStore(SharedDirFeatureStore):
    """Stops for good inside ``retain`` of one sample, once its marker is written."""

    stop_in_retain: str | None = None

    def retain(self, ref: SampleRef) -> None:
        super().retain(ref)
        if ref.sample_id == self.stop_in_retain:
            print(f"stopped {ref.sample_id}", flush=True)
            threading.Event().wait()


def main(argv: list[str]) -> None:
    url, name, directory, first, count, stop_at, where = argv
    store = StoppingStore(directory, orphan_interval=None)
    victim = f"s{stop_at}"
    if where == "retained":
        store.stop_in_retain = victim
    if where == "lease":
        queue = RedisSampleRefQueue(store, VisibilityTimeout(1.0), url=url, name=name, **QUEUE_OPTIONS)
        lease = queue.acquire(timeout=30)
        assert lease is not None
        store.get(lease.ref)
        print(f"leased {lease.ref.sample_id}", flush=True)
        threading.Event().wait()
    queue = RedisSampleRefQueue(store, url=url, name=name, **QUEUE_OPTIONS)
    for index in range(int(first), int(first) + int(count)):
        ref = store.put(f"s{index}", sample_tensors(index, TOKENS))
        if ref.sample_id == victim and where == "stored":
            print(f"stopped {victim}", flush=True)
            threading.Event().wait()
        queue.put(ref)
    print("done", flush=True)
    queue.disconnect()


if __name__ == "__main__":
    main(sys.argv[1:])
