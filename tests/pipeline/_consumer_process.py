"""The consumer side of the processes test: a real FeatureDataLoader in a child process.

The queue lives in the parent (the producer's process); this process reaches
it through ``PipeQueue``, a stand-in speaking a tiny request/reply protocol
over a ``multiprocessing`` pipe. The store is this process's own
``SharedDirFeatureStore`` instance on the shared directory.
"""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any

import torch

from featurestream import FeatureDataLoader, Lease, SharedDirFeatureStore, VisibilityTimeout


class PipeQueue:
    """The queue surface a ``FeatureDataLoader`` uses, served by the parent over ``conn``."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    def _call(self, *message: Any) -> Any:
        self._conn.send(message)
        return self._conn.recv()

    def acquire(self, poll_interval: float = 0.05, *, timeout: float | None = None) -> Lease | None:
        reply = self._call("acquire", poll_interval if timeout is None else timeout)
        if reply is None:
            return None
        ref, lease_id, redelivery_count = reply
        return Lease(ref, 0.0, VisibilityTimeout(), redelivery_count, lease_id)

    def ack(self, lease: Lease) -> None:
        self._call("ack", lease.lease_id)

    def fail(self, lease: Lease) -> None:
        self._call("fail", lease.lease_id)

    def close(self) -> None:
        self._call("close")

    @property
    def is_closed(self) -> bool:
        return bool(self._call("is_closed"))

    def pending_count(self) -> int:
        return int(self._call("pending_count"))

    def outstanding_count(self) -> int:
        return int(self._call("outstanding_count"))


def consumer_main(conn: Connection, directory: str, crash_at: int | None) -> None:
    """Train (checksum) every batch; at batch ``crash_at`` announce it and wait to be SIGKILLed mid-lease."""
    torch.set_num_threads(1)
    # PipeQueue is a one-thread pipe protocol, and the test counts exactly one reclaimed lease: no prefetch thread.
    loader = FeatureDataLoader(PipeQueue(conn), SharedDirFeatureStore(directory), prefetch=0)
    for count, batch in enumerate(loader, 1):
        lease = loader.current_lease
        assert lease is not None
        if count == crash_at:
            conn.send(("holding", lease.ref.sample_id))
            conn.recv()  # never answered: the parent kills this process while it holds the lease and the file
        checksum = float(batch.logits.double().sum()) + float(batch.aux_hidden_states.double().sum())
        conn.send(("trained", lease.ref.sample_id, checksum))
    loader.close()
    conn.send(("done",))
