"""Store calls a queue owes its store, and the end of every queue operation: shared by both queue backends.

A ``scrub`` or ``unretain`` that raised is owed: kept in an ordered ``{sample id: (call, ref)}`` backlog
and retried later. The queue holds its lock around these, except ``run_deferred``.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

from featurestream.common.refs import SampleRef
from featurestream.stores.base import FeatureStore

__all__ = ["Owed", "Outbox", "StoreFault", "call_or_owe", "owe", "pay_owed", "run_deferred"]

logger = logging.getLogger(__name__)

Owed = collections.OrderedDict[str, tuple[str, SampleRef]]
# Callbacks queued under the lock, each with its one argument, to run after it is released.
Outbox = list[tuple[Callable[..., None], object]]
# (store call, sample id or None, the exception): the queue's own logging, counting and tracing of a fault.
StoreFault = Callable[[str, "str | None", BaseException], None]


def call_or_owe(store: FeatureStore, owed: Owed, call: str, ref: SampleRef, on_fault: StoreFault) -> bool:
    """Make the store call ``call(ref)``; if it raises, report it to ``on_fault`` and owe it (newest last).

    ``True``: done.
    """
    try:
        getattr(store, call)(ref)
    except Exception as exc:
        owe(owed, call, ref, exc, on_fault)
        return False
    return True


def owe(owed: Owed, call: str, ref: SampleRef, exc: Exception, on_fault: StoreFault) -> None:
    """The store call ``call(ref)`` raised ``exc``: report it to ``on_fault`` and owe it (newest last)."""
    on_fault(call, ref.sample_id, exc)
    owed[ref.sample_id] = (call, ref)
    owed.move_to_end(ref.sample_id)


def pay_owed(store: FeatureStore, owed: Owed, on_fault: StoreFault, on_paid: Callable[[str, str], None]) -> None:
    """Retry owed calls, oldest first, calling ``on_paid(sample_id, call)`` for each that succeeds; one that
    fails again goes to the back and ends the round.

    So a store that keeps failing costs one store call per queue operation, not one per owed sample.
    """
    while owed:
        sample_id, (call, ref) = next(iter(owed.items()))
        try:
            getattr(store, call)(ref)
        except Exception as exc:
            on_fault(call, sample_id, exc)
            owed.move_to_end(sample_id)
            return
        del owed[sample_id]
        on_paid(sample_id, call)


def run_deferred(outbox: Outbox) -> None:
    """After an operation released its lock: run the callbacks it queued; one that raises is logged and ignored."""
    for callback, argument in outbox:
        try:
            callback(argument)
        except Exception:
            logger.exception("queue callback %r raised; the queue carries on", callback)
