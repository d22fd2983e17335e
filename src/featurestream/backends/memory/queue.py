"""``SampleRefQueue``: the in-process lease / ack / fail coordinator over ``SampleRef``s.

The reference path ``featurestream.queue`` is this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from featurestream.backends.memory.engine import MemoryEngine
from featurestream.common.errors import LeaseLost
from featurestream.core.backpressure import HealthCallback
from featurestream.core.coordinator import Coordinator, QueueOptions
from featurestream.core.engine import EngineContext
from featurestream.core.lease import DeadLetter, Lease, VisibilityTimeout
from featurestream.core.stats import DEFAULT_DEDUP_WINDOW, DEFAULT_MAX_DELIVERIES, QUEUE_STATS_GAUGES, QueueStats
from featurestream.stores.base import FeatureStore

if TYPE_CHECKING:
    from typing_extensions import Unpack

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


class SampleRefQueue(Coordinator):
    """The in-process ``LeaseQueue``: the shared coordinator over ``MemoryEngine``.

    The contract (lifecycle, store faults, callbacks, dead-letter repair, batches) is ``LeaseQueue``'s
    docstring; ``options`` are ``Coordinator``'s (``max_deliveries``, ``dedup_window``, ``on_dead_letter``,
    ``reaper_interval``, ``tracer``, ``keep_dead_letter_bytes``); ``clock`` (default ``time.monotonic``) is the
    deadline clock.
    """

    # The engine this class builds (a test subclass may swap in a seeded defect).
    _engine_class: type[MemoryEngine] = MemoryEngine
    _engine: MemoryEngine

    # ``Coordinator``'s six positional parameters are written out again here and in ``RedisSampleRefQueue``: a def
    # cannot inherit parameters, and each constructor is a public signature of its own (``inspect.signature``
    # and type checkers read it), so none can take another's.
    def __init__(
        self,
        store: FeatureStore,
        visibility_timeout: VisibilityTimeout | None = None,
        high_watermark_bytes: int | None = None,
        low_watermark_bytes: int | None = None,
        on_pause: HealthCallback | None = None,
        on_resume: HealthCallback | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        **options: Unpack[QueueOptions],
    ) -> None:
        def engine(context: EngineContext) -> MemoryEngine:
            return self._engine_class(context, clock=clock)

        backpressure = (high_watermark_bytes, low_watermark_bytes, on_pause, on_resume)
        super().__init__(store, visibility_timeout, *backpressure, engine=engine, **options)
