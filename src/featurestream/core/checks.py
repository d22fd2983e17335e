"""Argument checks shared by the queues, stores and pipeline: one wording for every bad value.

Each raises ``ValueError`` naming the parameter and the offending value; a
``bool`` is never accepted as a number (``True`` would otherwise pass as 1).
"""

from __future__ import annotations

import math

__all__ = ["check_count", "check_seconds"]


def check_count(name: str, value: object, *, minimum: int = 0, allow_none: bool = False) -> None:
    """``value`` must be an int >= ``minimum`` (or ``None`` when ``allow_none``)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_seconds(name: str, value: object, *, positive: bool = False) -> None:
    """``value`` must be a finite number of seconds, >= 0 (> 0 when ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    if positive and value == 0:
        raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
