"""Keeping the kit's failure report short: its own injected faults stay out of the logs, suspects are named.

The machine injects store faults and raising callbacks, and sends stale and
forged leases, on purpose; the queue logs each one it survives (a fault with
its traceback), which is right in production and noise in a test report.
``quiet_injected_faults`` drops exactly those records, from every handler
(pytest's capture included), while a machine runs: whether the queue handled
them right is the invariants' verdict. Of the records it lets through, a
repeat (the same logger, message template and exception type, from any of the
test's examples) is dropped too: a store bug hit in hundreds of examples is
logged once, with its traceback. ``store_history`` and ``suspect`` turn the ``FaultyStore`` call log into
the part of an invariant message that says which store method to look at.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from featurestream.core.lease import StaleLog
from featurestream.testing.faults import InjectedFault

__all__ = ["InjectedCallbackError", "quiet_injected_faults", "store_history", "suspect"]

StoreLog = Sequence[tuple[str, "str | None", bool]]


class InjectedCallbackError(RuntimeError):
    """What a queue callback raises when the machine makes its callbacks raise (the queue must carry on)."""


# Only these exceptions themselves: an error raised while handling one (its __context__) is the queue's own.
_INJECTED = (InjectedFault, InjectedCallbackError)


class _QuietFilter(logging.Filter):
    """Drops records about the kit's own injections (their exception, or one of their arguments, is one, or
    they report a stale or forged lease rejected) and repeats of the others."""

    def __init__(self) -> None:
        super().__init__()
        # The first record let through per (logger, template, exception type). Each handler filters the same
        # record object, so the first one passes every handler and only later records count as repeats.
        self.first: dict[tuple[str, object, type | None], logging.LogRecord] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if self._injected(record):
            return False
        error = record.exc_info[1] if record.exc_info else None
        key = (record.name, record.msg, None if error is None else type(error))
        return self.first.setdefault(key, record) is record

    @staticmethod
    def _injected(record: logging.LogRecord) -> bool:
        if record.msg == StaleLog.MESSAGE:
            return True
        if record.exc_info and isinstance(record.exc_info[1], _INJECTED):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        return any(isinstance(arg, _INJECTED) for arg in args)


_FILTER = _QuietFilter()
_lock = threading.Lock()
_users = 0
_owner: object = None
_filtered: list[logging.Handler] = []


def quiet_injected_faults(on: bool, owner: object = None) -> None:
    """Start (``on``) or stop dropping the injections' log records and repeats; nested machines count.

    A machine starts when it is built and stops at its ``teardown`` (whoever
    builds one must tear it down, as Hypothesis does). ``owner`` (the machine
    class) scopes the repeats: the examples of one test share what was
    logged, a machine of another class starts afresh. Handler filters, not
    logger ones: a logger's filter never sees the records its children
    propagate, and the queue logs under its own module's name. Every handler
    present when the first machine starts is filtered (pytest installs its
    capture handlers before the test body runs), and the last-resort handler
    that prints when there is none.
    """
    global _users, _owner
    with _lock:
        if on:
            if owner is not _owner:
                _owner = owner
                _FILTER.first.clear()
            _users += 1
            if _users == 1:
                _filtered[:] = _handlers()
                for handler in _filtered:
                    handler.addFilter(_FILTER)
        elif _users:
            _users -= 1
            if _users == 0:
                for handler in _filtered:
                    handler.removeFilter(_FILTER)
                _filtered.clear()


def _handlers() -> list[logging.Handler]:
    loggers = [
        logging.getLogger(),
        *(x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)),
    ]
    handlers = {id(h): h for logger in loggers for h in logger.handlers}
    if logging.lastResort is not None:
        handlers[id(logging.lastResort)] = logging.lastResort
    return list(handlers.values())


def store_history(log: StoreLog, sample_id: str) -> list[str]:
    """The store calls made on ``sample_id`` through the machine's store, in order; a failed one ends in ``!``."""
    return [call if ok else f"{call}!" for call, about, ok in log if about == sample_id]


def suspect(log: StoreLog, sample_id: str, problem: str) -> str:
    """The sentence naming the likeliest culprit of ``problem`` for ``sample_id``, and the calls it made.

    ``problem`` is ``"lost"`` (a queued sample's bytes gone), ``"leaked"``
    (a settled sample's bytes still there) or ``"bytes"`` (materialised with
    the wrong bytes).
    """
    calls = store_history(log, sample_id)
    done = set(calls)
    if problem == "leaked":
        culprit = (
            "store.scrub() was called for it and did not free it"
            if "scrub" in done
            else "the queue never called store.scrub() for it after it settled"
        )
    elif problem == "lost":
        if "retain" not in done:
            culprit = "the queue never called store.retain() for it before handing it out"
        elif "release" in done:
            culprit = "store.release() freed a retained sample (or store.retain() did not retain it)"
        else:
            culprit = "store.retain() did not keep it, or the store dropped it on its own"
    else:
        culprit = "store.put() stored, or store.get() returned, other bytes than the producer's"
    return f"suspect: {culprit}; store calls on {sample_id!r}: {', '.join(calls) or 'none'}"
