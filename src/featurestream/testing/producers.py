"""``BlockedPut``: one ``put_blocks_until_below`` on a real thread, advanced one round at a time by a test."""

from __future__ import annotations

import threading

from featurestream.common.refs import SampleRef
from featurestream.core.protocol import LeaseQueue

__all__ = ["BlockedPut"]


class BlockedPut:
    """A producer thread blocked in ``queue.put_blocks_until_below(ref)``, stepped deterministically.

    The put's ``abort_when`` is a gate: the queue calls it at the top of every
    round (re-check of the store's health, the hysteresis, enqueue or wait),
    and the gate lets exactly one round through per ``step()``. So the
    thread really is inside ``put_blocks_until_below`` between steps, yet what
    it does to the queue happens only while the test is waiting for it, in
    an order the test knows. ``poll_interval=0``: a round never sleeps.
    """

    def __init__(self, queue: LeaseQueue, ref: SampleRef, bound: float) -> None:
        self.ref = ref
        self.bound = bound
        self.outcome: BaseException | str | None = None  # "enqueued", or what the put raised
        self.rounds = 0
        self._cond = threading.Condition()
        self._permits = 0
        self._at_gate = False
        self._abort = False
        self._queue = queue
        self.thread = threading.Thread(target=self._run, name=f"blocked-put-{ref.sample_id}", daemon=True)

    def start(self) -> bool:
        """Start the thread; ``True`` once it stands at its first gate (or finished) within ``bound``."""
        self.thread.start()
        with self._cond:
            return self._cond.wait_for(self._settled, self.bound)

    def step(self) -> bool:
        """Let one round through; ``True`` once it is back at the gate or finished within ``bound``."""
        with self._cond:
            if self.outcome is not None:
                return True
            self._permits += 1
            self._cond.notify_all()
            return self._cond.wait_for(self._settled, self.bound)

    @property
    def done(self) -> bool:
        with self._cond:
            return self.outcome is not None

    def abort(self) -> None:
        """Make the put's ``abort_when`` say yes, and wait (up to ``bound``) for the thread to end."""
        with self._cond:
            self._abort = True
            self._cond.notify_all()
        self.thread.join(self.bound)

    def _settled(self) -> bool:
        return self.outcome is not None or (self._at_gate and self._permits == 0)

    def _gate(self) -> bool:
        with self._cond:
            self._at_gate = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._permits > 0 or self._abort)
            self._at_gate = False
            if self._abort:
                return True
            self._permits -= 1
            self.rounds += 1
            return False

    def _run(self) -> None:
        outcome: BaseException | str
        try:
            self._queue.put_blocks_until_below(self.ref, poll_interval=0, abort_when=self._gate)
            outcome = "enqueued"
        except BaseException as exc:  # reported to the test, never lost in the thread
            outcome = exc
        with self._cond:
            self.outcome = outcome
            self._cond.notify_all()
