"""``BackgroundDeleter``: unlink files on a worker thread, so ``scrub`` does not pay for freeing a sample.

Unlinking a large file frees its page-cache pages in the calling thread: about
1.5 ms for a 22 MiB sample, paid by the trainer on every ack. A store that
renames the file out of the way first (the name is gone at once) can hand the
unlink here instead. The worker starts on demand, exits after ``IDLE_SECONDS``
without work, and is restarted in a forked child. ``flush`` waits for every
path handed over so far; paths still pending at interpreter exit are unlinked
then, so a process that never closes its store leaks nothing either.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable

__all__ = ["IDLE_SECONDS", "BackgroundDeleter", "remove_reporting"]

logger = logging.getLogger(__name__)

IDLE_SECONDS = 1.0

_LIVE: weakref.WeakSet[BackgroundDeleter] = weakref.WeakSet()


class BackgroundDeleter:
    """Unlinks the paths ``submit`` hands it, in order, on one worker thread.

    A missing file counts as unlinked; any other ``OSError`` goes to
    ``on_error(path, exc)``, called on the worker thread.
    """

    def __init__(self, on_error: Callable[[str, OSError], None]) -> None:
        self._on_error = on_error
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._pending: deque[str] = deque()
        self._busy = False  # the worker holds a path it took from ``_pending``
        self._worker: threading.Thread | None = None
        self._pid = os.getpid()
        _LIVE.add(self)

    def submit(self, path: str) -> None:
        """Unlink ``path`` soon, off the calling thread."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's worker is not here
                self._pid, self._worker, self._busy = os.getpid(), None, False
            self._pending.append(path)
            self._changed.notify_all()
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="featurestream-deleter", daemon=True)
                self._worker.start()

    def flush(self) -> None:
        """Return once every path submitted before the call is unlinked (or handed to ``on_error``)."""
        with self._lock:
            if self._worker is None or self._pid != os.getpid():
                paths = list(self._pending)
                self._pending.clear()
            else:
                while self._pending or self._busy:
                    self._changed.wait()
                return
        for path in paths:
            self._unlink(path)

    def _work(self) -> None:
        while True:
            with self._lock:
                self._busy = False
                self._changed.notify_all()
                if not self._pending and not self._changed.wait_for(lambda: bool(self._pending), IDLE_SECONDS):
                    self._worker = None
                    return
                path = self._pending.popleft()
                self._busy = True
            try:
                self._unlink(path)
            except Exception:  # the worker must outlive a failing error hook, or flush would wait forever
                logger.exception("unlinking %s failed", path)

    def _unlink(self, path: str) -> None:
        remove_reporting(path, self._on_error)


def remove_reporting(
    path: str, on_error: Callable[[str, OSError], None], remove: Callable[[str], None] | None = None
) -> None:
    """``remove(path)`` (default ``os.unlink``); a missing file counts as removed, any other ``OSError`` goes to
    ``on_error(path, exc)``."""
    try:
        (remove or os.unlink)(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        on_error(path, exc)


@atexit.register
def _flush_all() -> None:
    # Daemon workers stop at exit without finishing their queue: whatever is still pending is unlinked here.
    for deleter in list(_LIVE):
        deleter.flush()
