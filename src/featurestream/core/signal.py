"""``Signal``: a condition of the queue's lock that notifies only when someone waits on it."""

from __future__ import annotations

import threading

__all__ = ["Signal"]


class Signal:
    """A condition of the queue's lock that notifies only when someone waits on it.

    ``threading.Condition.notify`` checks lock ownership and walks its waiters on every call, and the queue
    signals on every put and settle, nearly always with nobody waiting. ``waiting`` (how many threads wait) is
    read and changed only under the queue's lock (``Condition.wait`` re-acquires it before returning or raising);
    the hot paths read it themselves and call ``notify`` only when someone waits.
    """

    __slots__ = ("_condition", "waiting")

    def __init__(self, lock: threading.Lock) -> None:
        self._condition = threading.Condition(lock)
        self.waiting = 0

    def wait(self, timeout: float) -> None:
        self.waiting += 1
        try:
            self._condition.wait(timeout)
        finally:
            self.waiting -= 1

    def notify(self) -> None:
        if self.waiting:
            self._condition.notify()

    def notify_all(self) -> None:
        if self.waiting:
            self._condition.notify_all()
