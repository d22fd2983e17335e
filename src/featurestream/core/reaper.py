"""The reaper thread a queue may start: reclaims expired leases for a queue nobody polls."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

__all__ = ["start_reaper"]

logger = logging.getLogger(__name__)

Owner = TypeVar("Owner")


def start_reaper(
    owner: Owner, round: Callable[[Owner], bool], interval: float, stop: threading.Event, *, name: str
) -> None:
    """Start a daemon thread ``name`` running ``round(owner)`` every ``interval`` seconds.

    ``round`` reaps once and returns whether there is more to do. The thread ends when ``stop`` is set, when a
    round returns ``False``, or once ``owner`` is collected (it holds it only weakly between rounds). A round
    that raises is logged and the next round runs.
    """
    ref = weakref.ref(owner)

    def run() -> None:
        while not stop.wait(interval):
            target = ref()
            if target is None:
                return
            try:
                if not round(target):
                    return
            except Exception:
                logger.exception("the reaper round of %s raised; it carries on", name)
            del target

    threading.Thread(target=run, name=name, daemon=True).start()
