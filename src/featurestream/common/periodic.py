"""Daemon threads that run a round every few seconds for an object they must not keep alive."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

__all__ = ["start_periodic"]

logger = logging.getLogger(__name__)

Owner = TypeVar("Owner")


def start_periodic(
    owner: Owner, round: Callable[[Owner], object], interval: float, stop: threading.Event, *, name: str
) -> None:
    """Start a daemon thread ``name`` running ``round(owner)`` every ``interval`` seconds.

    The thread ends when ``stop`` is set, when a round returns ``False`` (any other result carries on), or once
    ``owner`` is collected (it holds it only weakly between rounds). A round that raises is logged and the next
    round runs.
    """
    ref = weakref.ref(owner)

    def run() -> None:
        while not stop.wait(interval):
            target = ref()
            if target is None:
                return
            try:
                if round(target) is False:
                    return
            except Exception:
                logger.exception("a round of %s raised; it carries on", name)
            del target

    threading.Thread(target=run, name=name, daemon=True).start()
