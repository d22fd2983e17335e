"""The producer's backpressure: the hysteresis both queue backends apply to their store's ``health()``."""

from __future__ import annotations

from collections.abc import Callable

from featurestream.core import events
from featurestream.core.machines import BACKPRESSURE, BACKPRESSURE_MACHINE, fire
from featurestream.stores.base import StoreHealth

__all__ = ["Backpressure", "HealthCallback"]

HealthCallback = Callable[[StoreHealth], None]


class Backpressure:
    """The backpressure machine's model (``state``: ``flowing`` or ``paused``) and its hysteresis rule.

    Pause at/above the high watermark, resume at/below the low one, keep the state inside the band. With a
    watermark ``None`` the store's own ``high_watermark_hit`` / ``low_watermark_hit`` flag decides. The
    store's sample-count cap (``StoreHealth.sample_capacity``) is a second high watermark: a store holding
    that many samples pauses the producer, and it resumes only once a sample has left. A producer waits here
    with its own sample already counted, so a lone producer's next ``store.put`` finds room -- unless its put
    was let into an empty queue (then nothing the queue does frees a slot), or other producers' unqueued
    samples or settled samples whose scrub is owed take the last slots. Not thread-safe on its own: the owning
    queue calls it under its lock.
    """

    __slots__ = ("high", "low", "on_pause", "on_resume", "state")

    def __init__(
        self,
        high: int | None,
        low: int | None,
        on_pause: HealthCallback | None,
        on_resume: HealthCallback | None,
    ) -> None:
        self.state = BACKPRESSURE.initial
        self.high = high
        self.low = low
        self.on_pause = on_pause
        self.on_resume = on_resume

    def __str__(self) -> str:
        return "the producer's backpressure"

    def should_pause(self, health: StoreHealth) -> bool:
        if _at_sample_cap(health):
            return True
        if self.high is not None:
            return health.resident_bytes >= self.high
        return health.high_watermark_hit

    def should_resume(self, health: StoreHealth) -> bool:
        if _at_sample_cap(health):
            return False
        if self.low is not None:
            return health.resident_bytes <= self.low
        return health.low_watermark_hit

    def step(self, health: StoreHealth) -> tuple[str, HealthCallback] | None:
        """Fire ``pause`` or ``resume`` when ``health`` calls for it; return the trace event (``events.PAUSE`` /
        ``events.RESUME``) and the callback to run outside the queue's lock, or ``None`` when the state stays."""
        if self.state == "flowing" and self.should_pause(health):
            fire(BACKPRESSURE_MACHINE, "pause", self)
            return events.PAUSE, self.on_pause or _no_callback
        if self.state == "paused" and self.should_resume(health):
            fire(BACKPRESSURE_MACHINE, "resume", self)
            return events.RESUME, self.on_resume or _no_callback
        return None


def _at_sample_cap(health: StoreHealth) -> bool:
    """The store holds as many samples as its count cap allows (a further ``put`` would raise)."""
    return 0 < health.sample_capacity <= health.sample_count


def _no_callback(health: StoreHealth) -> None:
    """Stands in for an unset on_pause/on_resume."""
