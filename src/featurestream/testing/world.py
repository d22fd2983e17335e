"""``WorldActions``: the world around the queue in the stateful test (a mixin of ``QueueMachine``)."""

from __future__ import annotations

from featurestream.core.machines import HELD, SETTLED
from featurestream.testing.invariants import same_tensors
from featurestream.testing.machine_state import MachineState
from featurestream.testing.samples import sample_tensors

__all__ = ["WorldActions"]


class WorldActions(MachineState):
    """What happens around the queue: the store loses bytes or meets a stale incarnation of an id, time passes
    and the reaper runs, store calls and network replies fail until healed, and the callbacks change mode."""

    def do_store_loses(self, sample_id: str) -> None:
        """StoreLoses: the store loses a queued sample's bytes while no consumer reads it (``FaultyStore.lose``)."""
        sample = self.samples.get(sample_id)
        reading = any(sample_id in c.handles for c in self.consumers.values())
        if sample is None or sample.status not in HELD or reading or len(self.store.lost()) >= self.config.store_losses:
            return
        try:
            self.store.lose(sample_id)
        except Exception:  # a store whose scrub raises loses nothing through it: the queue's scrubs report it (inv05)
            return
        if self._still_there(sample):
            self._note("inv05_no_leak", f"{sample_id!r} is still resident; " + self._suspect(sample_id, "leaked"))
        if not self.mirror.store_loses(sample_id):
            raise AssertionError(f"the spec does not let the store lose {sample_id!r} now; the kit's guard is wrong")
        self._observe_residency()

    def _stale_candidates(self, op: str) -> list[str]:
        """The settled ids whose bytes are gone (for ``release``: of which a live consumer still has a handle)."""
        held = {sample_id for consumer in self.consumers.values() for sample_id in consumer.handles}
        return [
            sample_id
            for sample_id, sample in sorted(self.samples.items())
            if sample.status in SETTLED
            and sample_id not in self.owed
            and (op != "release" or sample_id in held)
            and not self._still_there(sample)
        ]

    def do_stale_incarnation(self, sample_id: str, op: str) -> None:
        """A handle or ref of an earlier put of ``sample_id`` meets a later put of the id.

        ``sample_id`` settled and its bytes were scrubbed; the producer puts the id into the store again (a new
        incarnation, with other bytes; the queue's dedup window would refuse it, so it goes to the store only).
        Then a consumer releases the handle it still has of the earlier put (``release``), or the earlier ref
        is retained, scrubbed or materialised (``get``). None of them may free, serve, retain or scrub the
        later put, which the consumer then reads and releases: its last handle, and nothing retains it, so
        the store frees it and the queue's world is as before the step.
        """
        sample = self.samples.get(sample_id)
        if sample is None or sample_id not in self._stale_candidates(op):
            return
        holder = next((c for c, held in self.consumers.items() if sample_id in held.handles), None)
        before = self.inner.health()
        later = sample_tensors(sample.index + self.config.samples, self.config.sample_tokens)
        try:
            fresh = self.inner.put(sample_id, later, run_id="machine")
        except MemoryError:
            return  # the store is at its cap: no room for the later put
        self.stale_ops[op] += 1
        name = "inv16_incarnations_never_cross"
        stale = f"{op} of the earlier put of {sample_id!r}"
        if fresh == sample.ref:
            self._note(name, f"two puts of {sample_id!r} returned equal refs: a ref must name its put")
        put_health = self.inner.health()
        if op == "release" and holder is not None:
            self.inner.release(self.consumers[holder].handles.pop(sample_id))
            self.mirror.release(holder, sample_id)
        elif op == "get":
            try:
                _, handle = self.inner.get(sample.ref)
            except KeyError:
                pass
            else:
                self.inner.release(handle)
                self._note(name, f"{stale} served bytes, though that put was scrubbed")
        else:
            try:
                getattr(self.inner, op)(sample.ref)  # retain / scrub: of a put the store no longer holds
            except Exception as exc:  # the contract: a stale incarnation's retain / scrub raises nothing
                self._note(
                    name,
                    f"store.{op}() of the earlier put of {sample_id!r}, which the store no longer holds, raised "
                    f"{exc!r}: {op} of a put that is gone must touch nothing and raise nothing (FeatureStore.{op})",
                )
        health = self.inner.health()
        if (health.sample_count, health.resident_bytes) != (put_health.sample_count, put_health.resident_bytes):
            self._note(name, f"{stale} changed health() from {put_health} to {health}")
        try:
            tensors, handle = self.inner.get(fresh)
        except KeyError as exc:
            self._note(name, f"{stale} freed the later put ({exc!r})")
            return
        if not same_tensors(tensors, later):
            self._note(name, f"after {stale}, the later put materialised other bytes")
        self.inner.release(handle)
        health = self.inner.health()
        if (health.sample_count, health.resident_bytes) != (before.sample_count, before.resident_bytes):
            why = "the stale retain retained it" if op == "retain" else "its last release did not free it"
            self._note(name, f"the later put of {sample_id!r} is still resident after {stale}: {why}")
            self.inner.scrub(fresh)

    def do_advance_clock(self, seconds: float) -> None:
        """Time passes (or jumps); leases past their deadline are reclaimed by the next call that reaps.

        The spec's time is abstract (its ``Reclaim`` may take any live lease), so
        the mirror moves only when the implementation reaps.
        """
        self.clock.advance(seconds)

    def do_reclaim(self) -> None:
        """Reclaim: ``reclaim_expired()`` returns how many it reclaimed."""
        due = len(self._due())
        count, error, _ = self._reaping_call("reclaim_expired()", self.queue.reclaim_expired)
        if error is not None and not isinstance(error, OSError):
            raise AssertionError(f"reclaim_expired() raised {error!r}")
        if error is None and count != due:
            self._note("inv10_expired_leases_reclaimed", f"reclaim_expired() returned {count}, {due} were due")

    def do_arm_fault(self, call: str, until_cleared: bool) -> None:
        """A store call starts failing: once, or until ``do_clear_faults``."""
        self.store.arm(call, times=None if until_cleared else 1)

    def do_lose_reply(self, call: str, until_cleared: bool) -> None:
        """The network starts losing the replies of ``call``: its next one, or every one until ``do_clear_faults``.

        The call runs on the server and the client retries it; the machine checks it as the one call it is.
        """
        assert self.replies is not None, "only a backend that declares lost replies (replies=) gets this rule"
        self.replies.arm(call, times=None if until_cleared else 1)

    def do_failover(self, at: str) -> None:
        """Failover: the primary is lost around the next queue call that changes the server's state, ``at`` one
        of ``FAILOVER_MOMENTS``; a replica is promoted and the old primary resyncs as a replica (``Resync``)
        before the call returns.

        The queue follows by itself; the machine checks the call as the one call it is.
        """
        assert self.failovers is not None, "only a backend that declares failovers (failovers=) gets this rule"
        self.failovers.arm(at)

    def _faults_armed(self) -> bool:
        return (
            self.store.armed()
            or (self.replies is not None and self.replies.armed())
            or (self.failovers is not None and self.failovers.armed())
        )

    def do_clear_faults(self) -> None:
        """The store and the network heal, and no failover is due; the next queue call pays what the queue owes
        the store."""
        self.store.clear()
        if self.replies is not None:
            self.replies.clear()
        if self.failovers is not None:
            self.failovers.clear()

    def do_set_callbacks(self, mode: str) -> None:
        """From now on the queue's callbacks record only, raise, or call the queue back."""
        self.callback_mode = mode
