"""``ConsumerActions``: the stateful test's consumer side (a mixin of ``QueueMachine``)."""

from __future__ import annotations

import dataclasses

from featurestream.common.errors import LeaseLost
from featurestream.core import events
from featurestream.core.lease import LOST_REASON, SCHEMA_REASON, Lease
from featurestream.core.machines import HELD, SETTLED
from featurestream.stores.base import SampleLostError, StoreHandle
from featurestream.testing.faults import InjectedFault
from featurestream.testing.machine_state import MachineState, SampleRecord

__all__ = ["ConsumerActions"]

# The ``QueueStats`` counter each settle counts under, and its trace event.
_COUNTER = {"ack": "acked", "fail": "failed", "give_back": "given_back"}
_SETTLE_EVENTS = (events.ACK, events.FAIL, events.GIVE_BACK)


class ConsumerActions(MachineState):
    """The consumers' spec actions: Acquire (one or many), Ack / Fail (one or a batch, live, stale or forged),
    GiveBack (a batch: a loader closing), Lose, Reject, Extend, Get and Release of the store handle, and Crash."""

    def do_acquire(self, consumer: str) -> Lease | None:
        """Acquire: lease the head of the pending FIFO (never blocks: ``timeout=0``)."""
        lease, error, _ = self._reaping_call(f"acquire() by {consumer}", lambda: self.queue.acquire(timeout=0))
        token = self.mirror.acquire(consumer)
        if error is not None:
            raise AssertionError(f"acquire(timeout=0) raised {error!r}")
        if lease is None:
            if self.pending:
                self._note("inv09_close_drain", f"acquire() returned None with {list(self.pending)} pending")
            if token is not None:
                self._note("inv12_agrees_with_spec_mirror", f"acquire() returned None, the spec leases {token}")
            return None
        self._took(consumer, lease, token)
        return lease

    def do_acquire_many(self, consumer: str, n: int) -> list[Lease]:
        """Acquire, ``n`` at a time: ``acquire_many(n, timeout=0)`` leases every pending head up to ``n``."""
        leases, error, _ = self._reaping_call(
            f"acquire_many({n}) by {consumer}", lambda: self.queue.acquire_many(n, timeout=0)
        )
        if error is not None:
            raise AssertionError(f"acquire_many({n}, timeout=0) raised {error!r}")
        want = min(n, len(self.pending))  # the reap came first: its redeliveries are pending too
        if len(leases) != want:
            self._note("inv09_close_drain", f"acquire_many({n}) leased {len(leases)}, {list(self.pending)} pending")
        for lease in leases:
            self._took(consumer, lease, self.mirror.acquire(consumer))
        return leases

    def _took(self, consumer: str, lease: Lease, token: object) -> None:
        """Record one lease ``consumer`` got; ``token`` is the one the spec leased at that step."""
        sample_id = lease.ref.sample_id
        sample = self.samples.get(sample_id)
        if sample is None:
            raise AssertionError(f"acquire() returned a sample this test never put: {sample_id!r}")
        if sample.status in SETTLED:
            self._note("inv02_exactly_once", f"{sample.status} sample {sample_id!r} was delivered again")
        if sample.status == "leased":
            self._note("inv01_one_live_lease_per_sample", f"{sample_id!r} leased again while its lease is live")
        if lease.redelivery_count >= self.config.max_deliveries:
            self._note(
                "inv07_bounded_delivery",
                f"{sample_id!r} delivered with redelivery_count {lease.redelivery_count} "
                f"(max_deliveries={self.config.max_deliveries})",
            )
        if token != (sample_id, lease.redelivery_count):
            self._note(
                "inv12_agrees_with_spec_mirror",
                f"acquire() leased {(sample_id, lease.redelivery_count)}, the spec leases {token}",
            )
        if sample_id in self.pending:
            self.pending.remove(sample_id)
        sample.status = "leased"
        sample.live = lease
        sample.deadline = self.clock.now + self.config.visibility_timeout
        if lease.deadline != sample.deadline:
            self._note("inv10_expired_leases_reclaimed", f"lease deadline {lease.deadline}, expected {sample.deadline}")
        self.consumers[consumer].leases.append(lease)
        self._own(consumer, lease)

    def do_settle_many(self, consumer: str, op: str) -> None:
        """``ack_many`` / ``fail_many`` / ``give_back_many`` of every lease ``consumer`` holds, live or stale, in the
        order it got them.

        Each live one must be settled and each stale one rejected on its own: the trace's per-item
        ``Ack``/``Fail``/``GiveBack`` events name exactly the live leases, in order.
        """
        skip = self.store.lost()  # their holder settles none of those: its read would find the bytes gone
        if op == "ack":  # nor acks what its schema refuses (it rejects those)
            skip |= self.config.untrainable_ids
        leases = [lease for lease in self.consumers[consumer].leases if lease.ref.sample_id not in skip]
        if not leases:
            return
        counter = _COUNTER[op]
        before = getattr(self.queue.stats(), counter)
        seen = len(self.trace.events)
        call = getattr(self.queue, f"{op}_many")
        _, error, new_dead = self._reaping_call(f"{op}_many of {len(leases)} leases", lambda: call(leases))
        if error is not None:
            raise AssertionError(f"{op}_many() raised {error!r}")
        live = [lease for lease in leases if self.samples[lease.ref.sample_id].live is lease]
        settled = [f.get("lease_id") for a, f in self.trace.events[seen:] if a in _SETTLE_EVENTS]
        if settled and settled != [lease.lease_id for lease in live]:
            self._note("inv03_terminal_leases_never_change", f"{op}_many settled {settled}, the live ones: {live}")
        if getattr(self.queue.stats(), counter) - before != len(live):
            self._note("inv11_counters_consistent", f"{op}_many settled {counter} != {len(live)} live leases")
        for lease in leases:
            sample = self.samples[lease.ref.sample_id]
            getattr(self.mirror, op)(consumer, self._token(lease))
            self._drop_lease(consumer, lease)
            if sample.live is lease:
                self._settled(sample, op, lease.ref.sample_id in new_dead)
        if op == "give_back":
            self._given_back.update(id(lease) for lease in leases)

    def _settled(self, sample: SampleRecord, op: str, dead: bool) -> None:
        """Record that ``op`` settled ``sample``'s live lease: acked, given back (pending, no delivery counted), or
        (``dead``: dead-lettered) requeued."""
        if op == "ack":
            sample.acks += 1
            sample.live = None
            sample.status = "acked"
        elif op == "give_back":
            sample.live = None
            sample.status = "pending"
            self.pending.append(sample.ref.sample_id)
        else:
            self._requeue(sample, dead)

    def _settle(self, lease: Lease, op: str, forged: Lease | None = None) -> None:
        """Ack or fail ``forged or lease`` on behalf of the consumer holding ``lease``."""
        consumer = self._alive(lease)
        actor = consumer if consumer is not None else self.config.consumer_ids[0]
        sample = self.samples[lease.ref.sample_id]
        target = forged if forged is not None else lease
        counter = _COUNTER[op]
        before = getattr(self.queue.stats(), counter)
        call = getattr(self.queue, op)
        _, error, new_dead = self._reaping_call(f"{op}(lease {lease.lease_id})", lambda: call(target))
        token = (sample.ref.sample_id, -1) if forged is not None else self._token(lease)
        getattr(self.mirror, op)(actor, token)
        if error is not None and not isinstance(error, OSError):
            raise AssertionError(f"{op}() raised {error!r}")
        if consumer is not None and forged is None:
            self._drop_lease(consumer, lease)
        accepted = getattr(self.queue.stats(), counter) - before == 1
        live = sample.live is lease
        if accepted and (forged is not None or not live):
            kind = "forged" if forged is not None else "stale"
            self._note("inv03_terminal_leases_never_change", f"{kind} {op} of lease {target.lease_id} was accepted")
        if not accepted and live and forged is None:
            self._note("inv11_counters_consistent", f"{op} of the live lease {lease.lease_id} was rejected")
        if accepted:
            self._settled(sample, op, sample.ref.sample_id in new_dead)

    def do_ack(self, lease: Lease) -> None:
        """Ack (also a stale or duplicate ack, when the lease is no longer live); a consumer rejects instead what
        its schema refuses, before it would read or train it."""
        if lease.ref.sample_id in self.config.untrainable_ids:
            self.do_reject(lease)
        elif self._alive(lease) is not None:
            self._settle_or_find_lost(lease, "ack")

    def do_fail(self, lease: Lease) -> None:
        """Fail (also a stale fail)."""
        if self._alive(lease) is not None:
            self._settle_or_find_lost(lease, "fail")

    def _settle_or_find_lost(self, lease: Lease, op: str) -> None:
        """Settle ``lease``, unless its holder would find the sample's bytes lost: then its read reports it."""
        consumer = self._alive(lease)
        holds = consumer is not None and any(held is lease for held in self.consumers[consumer].leases)
        if holds and lease.ref.sample_id in self.store.lost():
            self.do_get(lease)  # a consumer settles what it read; this read raises SampleLostError
        else:
            self._settle(lease, op)

    def do_lose(self, consumer: str, lease: Lease) -> None:
        """Lose: the consumer whose get raised ``SampleLostError`` reports it (``queue.lose``).

        The queue must dead-letter the sample at once with reason ``lost``, whatever deliveries are left (no
        redelivery could serve bytes that are gone); a stale lease changes nothing.
        """
        sample_id = lease.ref.sample_id
        sample = self.samples[sample_id]
        accepted, error, new_dead = self._reaping_call(f"lose(lease {lease.lease_id})", lambda: self.queue.lose(lease))
        self.mirror.lose(consumer, self._token(lease))
        if not self._letter_replied(consumer, lease, "lose", accepted, error):
            return
        letters = [d.reason for d in self.queue.dead_letters() if d.ref.sample_id == sample_id]
        if sample_id not in new_dead:
            self._note("inv04_no_loss", f"the store lost {sample_id!r}, lose() reported it, and the queue requeued it")
        elif letters != [LOST_REASON]:
            self._note("inv04_no_loss", f"lost {sample_id!r} was dead-lettered with reasons {letters}, not lost")
        self._requeue(sample, sample_id in new_dead)

    def do_reject(self, lease: Lease) -> None:
        """Reject: the consumer's schema refuses the sample's ref (``queue.reject``); a trainable sample's is not.

        The queue must dead-letter it at once with reason ``schema``, whatever deliveries are left, counted
        failed and dead, never acked (a reject that counts an ack fails ``inv17`` at once); a stale lease
        changes nothing.
        """
        consumer = self._alive(lease)
        sample_id = lease.ref.sample_id
        if consumer is None or sample_id not in self.config.untrainable_ids:
            return
        sample = self.samples[sample_id]
        before = self.queue.stats()
        why = f"sample {sample_id}: refused by the kit's schema"
        _, error, new_dead = self._reaping_call(
            f"reject(lease {lease.lease_id})", lambda: self.queue.reject(lease, why)
        )
        self.mirror.reject(consumer, (sample_id, lease.redelivery_count))
        after = self.queue.stats()
        accepted = after.failed - before.failed == 1
        accepted = self._letter_replied(consumer, lease, "reject", accepted, error)
        if after.acked != before.acked:  # stale or not
            self._fail(
                "inv17_acked_only_if_trained", f"reject of {sample_id!r} counted {after.acked - before.acked} acks"
            )
        if not accepted:
            return
        letters = [d.reason for d in self.queue.dead_letters() if d.ref.sample_id == sample_id]
        if sample_id not in new_dead:
            self._note("inv17_acked_only_if_trained", f"{sample_id!r} was rejected, and the queue redelivered it")
        elif letters[-1:] != [f"{SCHEMA_REASON}: {why}"]:
            self._note("inv17_acked_only_if_trained", f"rejected {sample_id!r} was dead-lettered with {letters}")
        self._requeue(sample, sample_id in new_dead)

    def _letter_replied(
        self, consumer: str, lease: Lease, op: str, accepted: bool, error: BaseException | None
    ) -> bool:
        """Check the reply of ``op`` (``lose`` or ``reject``: a dead letter at once) on ``lease``, which leaves its
        consumer: no error but an ``OSError``, the live lease accepted and no other. Whether it was accepted."""
        if error is not None and not isinstance(error, OSError):
            raise AssertionError(f"{op}() raised {error!r}")
        self._drop_lease(consumer, lease)
        live = self.samples[lease.ref.sample_id].live is lease
        if accepted and not live:
            self._note("inv03_terminal_leases_never_change", f"stale {op} of lease {lease.lease_id} was accepted")
        if not accepted and live:
            self._note("inv11_counters_consistent", f"{op} of the live lease {lease.lease_id} was rejected")
        return accepted

    def do_extend(self, lease: Lease, seconds: float | None, forged: Lease | None = None) -> None:
        """Extend: push the deadline of a live lease; ``LeaseLost`` for anything else."""
        consumer = self._alive(lease)
        if consumer is None and forged is None:
            return
        actor = consumer if consumer is not None else self.config.consumer_ids[0]
        sample = self.samples[lease.ref.sample_id]
        target = forged if forged is not None else lease
        before = self.queue.stats().extended
        lost = False

        def call() -> None:
            nonlocal lost
            try:
                self.queue.extend(target, seconds)
            except LeaseLost:
                lost = True

        _, error, _ = self._reaping_call(f"extend(lease {target.lease_id})", call)
        token = (sample.ref.sample_id, -1) if forged is not None else self._token(lease)
        self.mirror.extend(actor, token)
        if error is not None and not isinstance(error, OSError):
            raise AssertionError(f"extend() raised {error!r}")
        granted = self.queue.stats().extended - before == 1
        if granted == lost:
            self._note("inv11_counters_consistent", f"extend() granted={granted} but LeaseLost raised={lost}")
        live = sample.live is lease and forged is None
        if granted and not live:
            self._note("inv03_terminal_leases_never_change", f"extend of a non-live lease {target.lease_id} granted")
        if not granted and live:
            self._note("inv11_counters_consistent", f"extend of the live lease {lease.lease_id} raised LeaseLost")
        if granted and live:
            sample.deadline = self.clock.now + (self.config.visibility_timeout if seconds is None else seconds)
            if lease.deadline != sample.deadline:
                self._note("inv10_expired_leases_reclaimed", f"extend set {lease.deadline}, expected {sample.deadline}")

    def do_forge(self, lease: Lease, how: str, op: str) -> None:
        """A forged lease: a ``dataclasses.replace`` copy, or a made-up ``lease_id``; always rejected."""
        if how == "copy":
            forged = dataclasses.replace(lease)
        else:
            forged = dataclasses.replace(lease, lease_id=next(self._forged_ids))
        if op == "extend":
            self.do_extend(lease, None, forged=forged)
        else:
            self._settle(lease, op, forged=forged)

    def do_get(self, lease: Lease) -> StoreHandle | None:
        """Get: the lease holder materialises the sample (a slow consumer may do so with a stale lease)."""
        consumer = self._alive(lease)
        sample_id = lease.ref.sample_id
        if consumer is None or not any(held is lease for held in self.consumers[consumer].leases):
            return None
        if sample_id in self.consumers[consumer].handles:
            return None
        sample = self.samples[sample_id]
        self._sync_store()
        try:
            tensors, handle = self.store.get(lease.ref)
        except InjectedFault:
            return None  # the read failed before reaching the store: nothing changed
        except SampleLostError as exc:
            if sample_id not in self.store.lost():  # scrubbed, but a store of remote bytes cannot tell
                return self._get_refused(consumer, sample, exc)
            self.do_lose(consumer, lease)
            return None
        except KeyError as exc:
            return self._get_refused(consumer, sample, exc)
        if not self.mirror.get(consumer, sample_id):
            self._note("inv12_agrees_with_spec_mirror", f"get of {sample_id!r} succeeded, the spec has no bytes")
        self._compare(sample, tensors, "inv04_no_loss")
        self.consumers[consumer].handles[sample_id] = handle
        self._own(consumer, handle)
        return handle

    def _get_refused(self, consumer: str, sample: SampleRecord, error: KeyError) -> None:
        """A get that raised ``KeyError``: right only for a sample the spec holds no bytes of."""
        sample_id = sample.ref.sample_id
        if sample.status in HELD:
            self._note(
                "inv04_no_loss",
                f"get of {sample.status} sample {sample_id!r} raised {error!r}; {self._suspect(sample_id, 'lost')}",
            )
        if self.mirror.get(consumer, sample_id):
            self._note("inv12_agrees_with_spec_mirror", f"get of {sample_id!r} failed, the spec allows it")

    def do_release(self, handle: StoreHandle) -> None:
        """Release: the consumer drops its store handle (an injected fault leaves it held)."""
        consumer = self._alive(handle)
        if consumer is None or self.consumers[consumer].handles.get(handle.sample_id) is not handle:
            return
        try:
            self.store.release(handle)
        except InjectedFault:
            return
        del self.consumers[consumer].handles[handle.sample_id]
        self.mirror.release(consumer, handle.sample_id)
        self._observe_residency()

    def do_crash(self, consumer: str) -> None:
        """Crash: the consumer forgets its leases and handles without settling or releasing them."""
        state = self.consumers[consumer]
        if not state.leases and not state.handles:
            return
        state.generation += 1
        state.leases = []
        state.handles = {}
        self.mirror.crash(consumer)
