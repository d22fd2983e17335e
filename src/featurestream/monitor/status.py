"""Queue status snapshots: one plain dict with stable keys, for a trainer's logs and ``featurestream status``.

``snapshot(queue)`` reads any ``LeaseQueue`` (in-process ``SampleRefQueue`` or
``RedisSampleRefQueue``) through the protocol alone. ``StatusWatcher(queue)``
does the same and adds per-second rates of every counter over the interval
since its previous snapshot. The keys (``docs/operations.md`` is the reference):

- ``lifecycle``: ``"open"``, ``"draining"`` (closed, still holding samples) or ``"drained"``;
- ``pending``: samples waiting to be leased; ``leased``: samples leased right now;
  ``scrub_backlog``: settled samples whose store scrub the queue still owes and retries;
- ``oldest_lease_age_s``: seconds since the oldest live lease was issued, ``None`` when none is out;
- ``counters``: the ``QueueStats`` counters since the queue was created (``put``, ``leased`` --
  every lease ever issued --, ``acked``, ``failed``, ``reclaimed``, ``dead_lettered``, ...);
- ``rates``: counter name -> events per second over ``interval_s``; ``None`` (and
  ``interval_s`` ``None``) from ``snapshot`` and on a watcher's first snapshot;
- ``backpressure``: this process's producer state, ``"flowing"`` or ``"paused"``; ``None``
  when unknown (an operator's handle on a shared Redis queue produces nothing: each
  producer process has its own state; ``counters["producer_pauses"]`` counts them all);
- ``dead_letters``: ``{"count": n, "newest": [{"sample_id", "reason", "deliveries"}, ...]}``,
  newest first, at most ``newest_dead_letters`` entries.

Keys are only ever added, never renamed or removed (``SCHEMA`` names this version).
The counters and the two gauges come from one consistent ``stats()``; the
lifecycle, the lease age and the newest dead letters are each read by a call of
their own, so under traffic they may be a few events apart. Only the newest
``newest_dead_letters`` dead letters are read (``dead_letters(newest=...)``), so
a snapshot costs O(that), however many dead letters the queue holds.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from featurestream.backends.memory.queue import QUEUE_STATS_GAUGES, QueueStats
from featurestream.common.checks import check_count, check_flag
from featurestream.core.protocol import LeaseQueue

__all__ = ["COUNTERS", "GAUGES", "SCHEMA", "StatusWatcher", "snapshot"]

SCHEMA = 1
# QueueStats' gauges -> their top-level snapshot keys (``outstanding`` reads as ``leased`` to an operator);
# every other field is a cumulative counter.
_GAUGE_FIELDS = tuple((name, "leased" if name == "outstanding" else name) for name in QUEUE_STATS_GAUGES)
COUNTERS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(QueueStats) if f.name not in QUEUE_STATS_GAUGES)
GAUGES: tuple[str, ...] = tuple(key for _, key in _GAUGE_FIELDS)
DEFAULT_NEWEST_DEAD_LETTERS = 5


def snapshot(
    queue: LeaseQueue, *, newest_dead_letters: int = DEFAULT_NEWEST_DEAD_LETTERS, backpressure: bool = True
) -> dict[str, Any]:
    """One status snapshot of ``queue`` (``rates`` and ``interval_s`` are ``None``: see ``StatusWatcher``).

    ``newest_dead_letters`` caps the dead-letter reasons listed, and read (the
    count is always exact; 0 skips the listing).
    ``backpressure=False`` reports the backpressure state as ``None``: pass it
    for a handle that produces nothing (an operator's view of a shared queue),
    whose own state says nothing about the producers.
    Thread-safe: every read is one of the queue's own thread-safe calls.
    """
    _check_arguments(queue, newest_dead_letters, backpressure)
    stats = queue.stats()
    # Every dead letter enters the list once (dead_lettered) and leaves it once (requeued or purged): the
    # consistent counters give the count without listing them.
    newest = queue.dead_letters(newest=newest_dead_letters)[::-1] if newest_dead_letters else []
    return {
        "schema": SCHEMA,
        "lifecycle": queue.lifecycle_state,
        **{key: getattr(stats, name) for name, key in _GAUGE_FIELDS},
        "oldest_lease_age_s": queue.oldest_lease_age(),
        "counters": {name: getattr(stats, name) for name in COUNTERS},
        "rates": None,
        "interval_s": None,
        "backpressure": queue.backpressure_state if backpressure else None,
        "dead_letters": {
            "count": stats.dead_lettered - stats.requeued - stats.purged,
            "newest": [
                {"sample_id": letter.ref.sample_id, "reason": letter.reason, "deliveries": letter.deliveries}
                for letter in newest
            ],
        },
    }


class StatusWatcher:
    """Snapshots of one queue with counter rates over the interval since this watcher's previous snapshot.

    The first snapshot has ``rates`` ``None`` (no interval yet). ``clock`` is
    the monotonic clock the intervals are measured on (inject
    ``featurestream.testing.FakeClock`` in tests). Thread-safe: concurrent
    ``snapshot`` calls are serialised, so each interval is measured between
    two consecutive snapshots.
    """

    def __init__(
        self,
        queue: LeaseQueue,
        *,
        newest_dead_letters: int = DEFAULT_NEWEST_DEAD_LETTERS,
        backpressure: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _check_arguments(queue, newest_dead_letters, backpressure)
        if not callable(clock):
            raise TypeError(f"clock must be a callable returning seconds, got {clock!r}")
        self.queue = queue
        self._newest = newest_dead_letters
        self._backpressure = backpressure
        self._clock = clock
        self._lock = threading.Lock()
        self._previous: tuple[float, dict[str, int]] | None = None

    def snapshot(self) -> dict[str, Any]:
        """A ``snapshot`` of the queue, with ``rates`` and ``interval_s`` filled from the second call on."""
        with self._lock:
            now = self._clock()
            status = snapshot(self.queue, newest_dead_letters=self._newest, backpressure=self._backpressure)
            counters = status["counters"]
            if self._previous is not None:
                then, before = self._previous
                interval = now - then
                status["interval_s"] = interval
                # Two snapshots in the same clock tick have no measurable rate: report 0 rather than divide by 0.
                status["rates"] = {
                    name: (counters[name] - before[name]) / interval if interval > 0 else 0.0 for name in COUNTERS
                }
            self._previous = (now, counters)
            return status


def _check_arguments(queue: object, newest_dead_letters: object, backpressure: object) -> None:
    if not isinstance(queue, LeaseQueue):
        raise TypeError(f"queue must implement featurestream.core.protocol.LeaseQueue, got {type(queue).__name__}")
    check_count("newest_dead_letters", newest_dead_letters)
    check_flag("backpressure", backpressure)
