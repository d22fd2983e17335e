"""The reaper thread both queue backends may start: reclaims expired leases for a queue nobody polls."""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Protocol

__all__ = ["Reaped", "start_reaper"]

logger = logging.getLogger(__name__)


class Reaped(Protocol):
    """What the reaper drives: a queue's ``reclaim_expired`` and its own notion of having nothing left to do."""

    def reclaim_expired(self) -> int: ...

    def _reaper_finished(self) -> bool: ...


def start_reaper(queue: Reaped, interval: float, stop: threading.Event, *, name: str) -> None:
    """Start a daemon thread ``name`` running ``queue.reclaim_expired()`` every ``interval`` seconds.

    It ends when ``stop`` is set, when ``queue._reaper_finished()`` says so, or once the queue is collected (it
    holds the queue only weakly between rounds). A round that raises is logged and the next round runs.
    """
    ref = weakref.ref(queue)

    def run() -> None:
        while not stop.wait(interval):
            target = ref()
            if target is None:
                return
            try:
                if target._reaper_finished():
                    return
                target.reclaim_expired()
            except Exception:
                logger.exception("the reaper round of %s raised; it carries on", name)
            del target

    threading.Thread(target=run, name=name, daemon=True).start()
