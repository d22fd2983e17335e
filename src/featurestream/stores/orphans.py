"""Orphan reclaim: the liveness of a store's writers, and the clock that lets a dead writer's bytes go.

A producer killed between ``store.put`` and ``queue.put`` leaves bytes nothing names. A store whose bytes
outlive their writer (``SharedDirFeatureStore``) frees them with a sweep any of its instances runs:

- every writer (store instance) holds a **liveness token** the OS releases when its process dies: a shared
  open-file-description lock (``F_OFD_SETLK``) on byte ``token`` of the store directory itself, so no file is
  added to the directory and a ``listdir`` or ``close`` elsewhere in the process never drops it. The token is
  the first 16 hex digits of every incarnation the writer mints, so a sample's file names its writer;
- the sweep (``OrphanClock``) notes each writer it finds dead and, once it has seen it dead for ``grace``
  seconds, lets the writer's samples go: those without a queued marker at once, marked ones only when the queue
  (asked then) holds them neither pending, leased nor as a dead letter. The grace period is the one timing
  assumption (``spec/OrphanReclaim.tla``): an enqueue a writer sent before it died reaches the queue within it.

A forked child shares its parent's token (the same open file description): the writer counts as alive while
either lives, which only delays a reclaim. Without OFD locks (not Linux) no writer can be probed and nothing is
ever reclaimed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import secrets
import struct
import threading
import time
import weakref
from collections.abc import Callable, Sequence

__all__ = [
    "DEFAULT_ORPHAN_GRACE",
    "DEFAULT_ORPHAN_INTERVAL",
    "Holds",
    "OrphanClock",
    "WriterToken",
]

logger = logging.getLogger(__name__)

DEFAULT_ORPHAN_GRACE = 10.0
DEFAULT_ORPHAN_INTERVAL = 5.0
TOKEN_DIGITS = 16  # hex digits of a token at the head of each incarnation
_TOKEN_LIMIT = 1 << 62  # a token is a lock offset: a positive off_t, well inside its range
_FLOCK = struct.Struct("hhqqi4x")  # struct flock (l_type, l_whence, l_start, l_len, l_pid) on 64-bit Linux
_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)
_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", None)

Holds = Callable[[Sequence[str]], set[str]]
"""A queue's answer to "which of these sample ids do you hold (pending, leased or dead-lettered)?"."""


def _lock_request(kind: int, token: int) -> bytes:
    return _FLOCK.pack(kind, os.SEEK_SET, token, 1, 0)


class WriterToken:
    """This store instance's liveness token in ``directory``, held until ``release`` or the process's death."""

    def __init__(self, directory: str) -> None:
        self.token = secrets.randbelow(_TOKEN_LIMIT - 1) + 1
        self.hex = f"{self.token:0{TOKEN_DIGITS}x}"
        self._fd: int | None = None
        self._lock = threading.Lock()  # a probe never uses the descriptor once released (its number may be reused)
        if _OFD_SETLK is None:
            return
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.fcntl(fd, _OFD_SETLK, _lock_request(fcntl.F_RDLCK, self.token))
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        # A store collected without close() gives its token (and descriptor) up too.
        self._close_fd = weakref.finalize(self, os.close, fd)

    def alive(self, token_hex: str) -> bool:
        """Whether the writer whose token is ``token_hex`` still holds it (any process, this one included).

        ``True`` when it cannot tell (no OFD locks, a token that is no lock offset, a probe that fails): an
        unknown writer is never reclaimed.
        """
        try:
            token = int(token_hex, 16)
        except ValueError:
            return True
        with self._lock:
            if token_hex == self.hex or self._fd is None or _OFD_GETLK is None or not 0 < token < _TOKEN_LIMIT:
                return True
            try:
                reply = fcntl.fcntl(self._fd, _OFD_GETLK, _lock_request(fcntl.F_WRLCK, token))
            except OSError as exc:
                reply = exc
        if isinstance(reply, OSError):
            logger.warning("cannot probe writer %s's liveness token (%s); treating it as alive", token_hex, reply)
            return True
        return bool(_FLOCK.unpack(reply)[0] != fcntl.F_UNLCK)

    def release(self) -> None:
        """Give the token up (idempotent): this writer is done, its samples are its own no more."""
        with self._lock:
            if self._fd is None:
                return
            self._fd = None
            with contextlib.suppress(OSError):  # a close that fails still drops the lock
                self._close_fd()


class OrphanClock:
    """When a sweep is due, and which dead writers' samples it may free (seen dead for ``grace`` seconds).

    Sightings live in the sweeping instance's memory, so a fresh instance (a restarted producer) first notes a
    dead writer and frees its samples a grace period later. Thread-safe.
    """

    def __init__(self, grace: float, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace = grace
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._dead_since: dict[str, float] = {}
        self._next = {False: clock(), True: clock()}

    def due(self, with_queue: bool) -> bool:
        """Whether ``interval`` has passed since the last sweep of the same kind that asked (a ``True`` starts the
        next interval): sweeps with a queue's answer and without one are paced apart, so the store's own sweeps
        never starve the queue's, which alone may free marked samples."""
        with self._lock:
            now = self._clock()
            if now < self._next[with_queue]:
                return False
            self._next[with_queue] = now + self.interval
            return True

    def ripe(self, writers: dict[str, bool]) -> set[str]:
        """Of ``writers`` (token -> alive now), those seen dead for ``grace`` seconds; forgets writers no longer
        listed (nothing of theirs is left) and notes the newly dead."""
        with self._lock:
            now = self._clock()
            self._dead_since = {
                token: self._dead_since.get(token, now) for token, alive in writers.items() if not alive
            }
            return {token for token, since in self._dead_since.items() if now - since >= self.grace}
