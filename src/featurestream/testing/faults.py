"""Faults of the world around a queue: ``FaultyStore`` (store calls raise ``OSError``, or bytes vanish), and what a
backend whose replies a network can lose (``LosesReplies``) or whose replicated server can lose its primary
(``FailsOver``) offers the machine."""

from __future__ import annotations

import collections
import errno
import threading
from collections.abc import Mapping
from typing import Any, Protocol

import torch

from featurestream.common.refs import SampleRef
from featurestream.stores.base import FeatureStore, SampleLostError, StoreHandle, StoreHealth

__all__ = [
    "CALLS",
    "EXACT_CALLS",
    "FAILOVER_MOMENTS",
    "QUEUE_CALLS",
    "UNTIL_CLEARED",
    "FailsOver",
    "FaultyStore",
    "InjectedFault",
    "LosesReplies",
]

# Every store call a fault can be armed on; the queue makes the last five itself.
CALLS = ("put", "get", "release", "retain", "scrub", "unretain", "health", "gc")
QUEUE_CALLS = ("retain", "scrub", "unretain", "health", "gc")
UNTIL_CLEARED = None  # ``arm(call, times=UNTIL_CLEARED)``: raise on every call until ``clear``
# The queue calls whose retry after a lost reply must have the effect of one call that got its reply, on the queue
# and on the store's accounting. Not acquire: a retried acquire leaves a lease nobody holds, which expires and is
# redelivered (a visible difference the contract allows).
EXACT_CALLS = (
    "put",
    "put_many",
    "ack",
    "ack_many",
    "fail",
    "fail_many",
    "lose",
    "extend",
    "reclaim_expired",
    "requeue_dead_letters",
    "purge_dead_letters",
)

# When the primary dies around the call: with the call's effect on it alone, with the effect on the replicas
# but the reply not sent, or just after the call returned.
FAILOVER_MOMENTS = ("unreplicated", "replicated", "returned")


class LosesReplies(Protocol):
    """A backend that a network separates from its server, declared by whoever builds its queue for the machine.

    ``make_queue_machine(..., replies=lambda queue: ...)`` returns one for each queue; the machine's
    ``lose_reply`` rule arms it and its ``clear_faults`` rule clears it. A lost reply is one whose call ran on
    the server and whose answer never reached the client: the client retries the call.
    """

    def arm(self, call: str, times: int | None = 1) -> None:
        """Lose the reply of the next ``times`` calls of queue method ``call`` (one of ``EXACT_CALLS``;
        ``UNTIL_CLEARED``: of every one until ``clear``)."""

    def clear(self) -> None:
        """Disarm every call armed by ``arm``."""

    def armed(self) -> bool:
        """Whether some call's reply would be lost now."""

    def lost(self) -> int:
        """How many replies were lost so far."""


class FailsOver(Protocol):
    """A backend whose server is a primary with replicas that take over when it is lost, declared by whoever
    builds its queue for the machine.

    ``make_queue_machine(..., failovers=lambda queue: ...)`` returns one for each queue; the machine's
    ``failover`` rule arms it (at most ``MachineConfig.failovers`` times a run) and its ``clear_faults`` rule
    disarms it. The next queue call that changes the server's state meets the loss of the primary (the spec's
    ``Failover``, ``spec/ReplicatedQueue.tla``) at the moment armed, a replica is promoted and the old primary
    rejoins as a replica (``Resync``) before the call returns; the queue follows by itself, and the machine
    checks the call as the one call it is.
    """

    def arm(self, at: str) -> None:
        """Lose the primary around the next state-changing queue call made on this thread, ``at`` one of
        ``FAILOVER_MOMENTS``."""

    def clear(self) -> None:
        """Disarm what ``arm`` armed."""

    def armed(self) -> bool:
        """Whether a call would meet a failover now."""

    def failovers(self) -> int:
        """How many failovers happened so far."""


class InjectedFault(OSError):
    """The ``OSError`` (``EIO``) a ``FaultyStore`` raises in place of the call it was armed on."""


class FaultyStore(FeatureStore):
    """Delegates every call to ``inner``, except armed ones, which raise ``InjectedFault`` *before* reaching it.

    So an injected fault never changes the inner store: the call simply did not
    happen. ``arm(call, times=1)`` makes the next ``times`` calls of ``call`` raise
    (``times=UNTIL_CLEARED``: every call until ``clear``); ``clear()`` disarms
    everything. ``raised`` counts the faults raised per call, and ``log`` lists
    ``(call, sample_id, ok)`` for every call (``sample_id`` ``None`` for
    ``health``/``gc``), so a test can tell which scrubs went through and what
    came before a ``health`` read; ``last_health`` is what the last successful
    ``health()`` returned (what its caller acted on). Thread-safe.
    """

    def __init__(self, inner: FeatureStore) -> None:
        if not isinstance(inner, FeatureStore):
            raise TypeError(f"FaultyStore wraps a FeatureStore, got {type(inner).__name__}")
        self.inner = inner
        self.store_uri = inner.store_uri
        self._lock = threading.Lock()
        self._armed: dict[str, int | None] = {}
        self.raised: collections.Counter[str] = collections.Counter()
        self.log: list[tuple[str, str | None, bool]] = []
        self.last_health: StoreHealth | None = None
        self._lost: set[str] = set()
        self._refs: dict[str, SampleRef] = {}  # each id's latest put through this wrapper: what ``lose`` frees

    # -- arming -------------------------------------------------------------
    def arm(self, call: str, times: int | None = 1) -> None:
        """Make the next ``times`` calls of ``call`` raise (``UNTIL_CLEARED``: all of them until ``clear``)."""
        if call not in CALLS:
            raise ValueError(f"cannot arm {call!r}: known store calls are {CALLS}")
        if times is not None and (isinstance(times, bool) or not isinstance(times, int) or times < 1):
            raise ValueError(f"times must be an int >= 1 or UNTIL_CLEARED, got {times!r}")
        with self._lock:
            self._armed[call] = times

    def clear(self, call: str | None = None) -> None:
        """Disarm ``call`` (default: every call)."""
        with self._lock:
            if call is None:
                self._armed.clear()
            else:
                self._armed.pop(call, None)

    def armed(self, call: str | None = None) -> bool:
        """Whether ``call`` (default: any call) would raise now."""
        with self._lock:
            return bool(self._armed) if call is None else call in self._armed

    def _enter(self, call: str, sample_id: str | None) -> None:
        with self._lock:
            if call not in self._armed:
                self.log.append((call, sample_id, True))
                return
            left = self._armed[call]
            if left is not None:
                if left <= 1:
                    del self._armed[call]
                else:
                    self._armed[call] = left - 1
            self.raised[call] += 1
            self.log.append((call, sample_id, False))
        what = call if sample_id is None else f"{call}({sample_id!r})"
        raise InjectedFault(errno.EIO, f"injected fault: store {what} failed")

    # -- lost bytes ---------------------------------------------------------------
    def lose(self, sample_id: str) -> None:
        """The store loses ``sample_id``'s bytes (its segment's owner died, it was evicted, the server restarted).

        The bytes of its latest put through this wrapper vanish: the inner store
        frees them and stops counting them, whatever handles are out, as the
        spec's ``StoreLoses`` does. Every later ``get`` of the id raises
        ``SampleLostError`` until the id is put again (a new incarnation); the
        queue's scrub of its dead letter finds nothing left to free. The bytes
        go through the inner store's ``scrub``, logged as the scrub it is (a
        store whose scrub frees nothing cannot lose them either). ``KeyError``
        for an id never put through this wrapper.
        """
        with self._lock:
            ref = self._refs.get(sample_id)
        if ref is None:
            raise KeyError(f"cannot lose {sample_id!r}: it was never put through this FaultyStore")
        self.inner.scrub(ref)  # what it raises propagates: then nothing was lost
        with self._lock:
            self._lost.add(sample_id)
            self.log.append(("scrub", sample_id, True))

    def lost(self) -> frozenset[str]:
        """The ids whose bytes are lost now."""
        with self._lock:
            return frozenset(self._lost)

    # -- the store contract, delegated ------------------------------------------
    def put(self, sample_id: str, tensors: Mapping[str, torch.Tensor], **kwargs: Any) -> SampleRef:
        self._enter("put", sample_id)
        ref = self.inner.put(sample_id, tensors, **kwargs)
        with self._lock:
            self._lost.discard(sample_id)
            self._refs[sample_id] = ref
        return ref

    def get(self, ref: SampleRef, device: torch.device | str | None = None, **kwargs: Any) -> Any:
        self._enter("get", ref.sample_id)
        with self._lock:
            if ref.sample_id in self._lost:
                raise SampleLostError(ref.sample_id, self.store_uri, "injected loss (FaultyStore.lose)")
        tensors, handle = self.inner.get(ref, device, **kwargs)
        return tensors, handle

    def release(self, handle: StoreHandle) -> None:
        self._enter("release", handle.sample_id)
        self.inner.release(handle)

    def retain(self, ref: SampleRef) -> None:
        self._hook("retain", ref)

    def unretain(self, ref: SampleRef) -> None:
        self._hook("unretain", ref)

    def scrub(self, ref: SampleRef) -> None:
        self._hook("scrub", ref)

    def _hook(self, call: str, ref: SampleRef) -> None:
        """One of the queue's residency hooks, ``call``, of ``ref``: raise if armed, else the inner store's."""
        self._enter(call, ref.sample_id)
        getattr(self.inner, call)(ref)

    def health(self) -> StoreHealth:
        self._enter("health", None)
        health = self.inner.health()
        with self._lock:
            self.last_health = health
        return health

    def gc(self) -> int:
        self._enter("gc", None)
        return self.inner.gc()

    def close(self) -> None:
        self.inner.close()

    def is_resident(self, sample_id: str) -> bool:
        return self.inner.is_resident(sample_id)

    def __getattr__(self, name: str) -> Any:
        # Store-specific extras (``directory``, ``data_path`` ...) stay reachable through the wrapper.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)
