"""The reaper thread a queue may start: reclaims expired leases (and sweeps orphans) for a queue nobody polls."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from featurestream.common.periodic import start_periodic

__all__ = ["start_reaper"]

Owner = TypeVar("Owner")


def start_reaper(
    owner: Owner, round: Callable[[Owner], bool], interval: float, stop: threading.Event, *, name: str
) -> None:
    """Start a daemon thread ``name`` running ``round(owner)`` every ``interval`` seconds.

    ``round`` reaps once and returns whether there is more to do. The thread ends when ``stop`` is set, when a
    round returns ``False``, or once ``owner`` is collected (it holds it only weakly between rounds). A round
    that raises is logged and the next round runs.
    """
    start_periodic(owner, round, interval, stop, name=name)
