"""``SampleRefQueue``: the in-process lease / ack / fail coordinator over ``SampleRef``s.

Formerly ``featurestream.core.queue`` (still an alias of this module, as is the reference path
``featurestream.queue``), so the names that module offered stay importable from here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from featurestream.backends.memory.engine import MemoryEngine
from featurestream.common.errors import LeaseLost
from featurestream.core.backpressure import HealthCallback
from featurestream.core.frontend import FrontEnd, Tracer
from featurestream.core.lease import DeadLetter, Lease, VisibilityTimeout
from featurestream.core.resume import MemoryLedger, TrainingLedger
from featurestream.core.stats import DEFAULT_DEDUP_WINDOW, DEFAULT_MAX_DELIVERIES, QUEUE_STATS_GAUGES, QueueStats
from featurestream.stores.base import FeatureStore

__all__ = [
    "DEFAULT_DEDUP_WINDOW",
    "DEFAULT_MAX_DELIVERIES",
    "DeadLetter",
    "Lease",
    "MemoryEngine",
    "QUEUE_STATS_GAUGES",
    "LeaseLost",
    "QueueStats",
    "SampleRefQueue",
    "VisibilityTimeout",
]


class SampleRefQueue(FrontEnd):
    """The in-process ``LeaseQueue``: the shared front end over ``MemoryEngine``.

    The contract (lifecycle, store faults, callbacks, dead-letter repair, batches) is ``LeaseQueue``'s
    docstring; ``clock`` (default ``time.monotonic``) is the deadline clock.
    """

    # The engine this class builds (a test subclass may swap in a seeded defect).
    _engine_class: type[MemoryEngine] = MemoryEngine
    _engine: MemoryEngine

    def __init__(
        self,
        store: FeatureStore,
        visibility_timeout: VisibilityTimeout | None = None,
        high_watermark_bytes: int | None = None,
        low_watermark_bytes: int | None = None,
        on_pause: HealthCallback | None = None,
        on_resume: HealthCallback | None = None,
        *,
        max_deliveries: int = DEFAULT_MAX_DELIVERIES,
        dedup_window: int = DEFAULT_DEDUP_WINDOW,
        on_dead_letter: Callable[[DeadLetter], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        reaper_interval: float | None = None,
        tracer: Tracer | None = None,
        keep_dead_letter_bytes: int = 0,
    ) -> None:
        self._init_front_end(
            store, visibility_timeout, high_watermark_bytes, low_watermark_bytes, on_pause, on_resume,
            max_deliveries=max_deliveries, dedup_window=dedup_window, on_dead_letter=on_dead_letter, tracer=tracer,
            keep_dead_letter_bytes=keep_dead_letter_bytes, reaper_interval=reaper_interval,
        )  # fmt: skip
        self._ledger: MemoryLedger | None = None
        engine = self._engine_class(
            self._report, self._lock, traced=tracer is not None, clock=clock, visibility_timeout=self._vt,
            max_deliveries=max_deliveries, dedup_window=dedup_window, keep_dead_letter_bytes=keep_dead_letter_bytes,
        )  # fmt: skip
        self._start(engine, "featurestream-reaper")

    def training_ledger(self) -> TrainingLedger:
        """The queue's training ledger (``docs/resume.md``), in this process's memory like the queue."""
        with self._lock:
            if self._ledger is None:
                self._ledger = MemoryLedger(self._holds)
            return self._ledger

    def _holds(self, sample_ids: Iterable[str]) -> set[str]:
        with self._op.reading():
            return self._engine.held(sample_ids)
