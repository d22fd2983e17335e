"""A fake monotonic clock to inject as ``SampleRefQueue(..., clock=...)``."""

from __future__ import annotations

import math
import threading

__all__ = ["FakeClock"]


class FakeClock:
    """A monotonic clock that only moves when ``advance`` is called; thread-safe.

    Lease deadlines are computed from it, so tests expire leases by advancing
    it instead of sleeping.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    @property
    def now(self) -> float:
        return self()

    def advance(self, seconds: float) -> float:
        """Move forward by ``seconds`` (finite, >= 0) and return the new time."""
        number = isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
        if not number or not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"FakeClock.advance needs finite seconds >= 0, got {seconds!r}")
        with self._lock:
            self._now += seconds
            return self._now

    def __repr__(self) -> str:
        return f"FakeClock(now={self.now!r})"
