"""Argument checks shared by the queues, stores and pipeline: one wording for every bad value.

Each raises naming the parameter and the offending value: ``ValueError`` for a
bad number (a ``bool`` is never accepted as one: ``True`` would otherwise pass
as 1), ``TypeError`` for a flag that is no ``bool``.
"""

from __future__ import annotations

import math

__all__ = ["check_count", "check_flag", "check_seconds", "check_text"]


def check_count(name: str, value: object, *, minimum: int = 0, allow_none: bool = False) -> None:
    """``value`` must be an int >= ``minimum`` (or ``None`` when ``allow_none``)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_flag(name: str, value: object) -> None:
    """``value`` must be a ``bool`` (a truthy ``1`` or ``"no"`` would be a silent guess)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")


def check_text(name: str, value: object) -> None:
    """``value`` must be a non-empty ``str``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    if not value:
        raise ValueError(f"{name} must be a non-empty str, got {value!r}")


def check_seconds(name: str, value: object, *, positive: bool = False) -> None:
    """``value`` must be a finite number of seconds, >= 0 (> 0 when ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    if positive and value == 0:
        raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
