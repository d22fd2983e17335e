"""``RedisEngine``: the engine (``core.engine.Engine``) behind ``RedisSampleRefQueue``.

Every state change is one atomic call of the server-side function library (``functions``); the server's
reply lists what the call did as events, which ``RedisEngine._apply`` reports to the coordinator in order.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import math
import secrets
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import redis

from featurestream.backends.redis import functions
from featurestream.backends.redis.link import Link, reply_text
from featurestream.backends.redis.replies import pending_gauge, refusal, requeue_refusal, sample_ids_of
from featurestream.backends.redis.resume import RedisTrainingLedger
from featurestream.backends.redis.wire import (
    dead_letter_from_json,
    event_state,
    lease_issued,
    ref_from_json,
    ref_to_json,
)
from featurestream.common import errors
from featurestream.common.refs import SampleRef
from featurestream.core import engine as contract
from featurestream.core.lease import DeadLetter, Lease
from featurestream.core.machines import HELD
from featurestream.stores.base import StoreHealth

__all__ = ["RedisEngine", "RedisLease"]

logger = logging.getLogger(__name__)

_NOT_ISSUED_HERE = "it is not the object this instance's acquire returned (a copy, or another process's or queue's)"
_SETTLED_BEFORE = "it was settled or reclaimed already"

# The functions that report settles from the ``retired`` feed to a producing caller.
_FEEDING = frozenset({"put", "put_many", "reclaim"})


@dataclasses.dataclass
class RedisLease(Lease):
    """A ``Lease`` issued by a ``RedisSampleRefQueue``; ``token`` proves it to the server."""

    token: str = dataclasses.field(default="", repr=False)


# A lease this call expects the server to report on: (the trigger, its lease, its model, if known yet).
_Expected = tuple[str, Lease, "contract.LeaseModel | None"]


class RedisEngine:
    """The Redis Functions engine (``core.engine.Engine``): every state change one atomic library call.

    The server reports what each call did as a flat event list (see ``functions``); ``_apply`` turns it into
    the coordinator's events, in order. This instance keeps what only it can know: the leases it was issued
    (the object and its token) and their lease-machine models, the samples it put and has not seen settled
    (their settles elsewhere arrive on the ``retired`` feed), and its place in that feed.
    """

    max_batch = functions.MAX_BATCH

    def __init__(
        self,
        context: contract.EngineContext,
        link: Link,
        name: str,
        *,
        clock: Callable[[], float] | None,
        store_uri: str | None,
    ) -> None:
        traced = context.traced
        self._report = context.report
        self._link = link
        self._name = name
        self._redis: redis.Redis = link.redis
        self._key = link.key
        self._retrying = link.retrying
        self._traced = traced
        self._server_time = clock is None
        self._clock: Callable[[], float] = clock if clock is not None else time.monotonic
        self._vt = context.visibility_timeout
        self._vt_arg = repr(float(context.visibility_timeout.seconds))
        self._dedup_window = context.dedup_window
        self._keep_cap = context.keep_dead_letter_bytes
        self._store_uri = store_uri  # None: an operator's handle, whose store holds nothing to release
        self._owes_scrub = context.owes_scrub
        # Put tokens and lease tokens: this instance's random prefix and a counter (unique, and unknown to
        # other processes; cheaper than fresh randomness per call).
        self._token_prefix = secrets.token_hex(8)
        self._token_counter = itertools.count()
        # The header's fixed middle and end (see _header; the feed cursor goes between them).
        self._settings = f"\t{context.max_deliveries}\t{context.dedup_window}\t"
        self._trace_flag = "\t1" if traced else "\t"
        # A traced call's events carry their state as a fourth item (see functions).
        self._event_width = 4 if traced else 3
        # Traced instances: the queue's state as this instance last saw it reported (pending, outstanding, now), which
        # the events the coordinator traces itself (StoreFault, ScrubRetried) carry, as the in-process queue's carry
        # its state.
        self._seen_state: dict[str, object] = {}
        self._issued: weakref.WeakValueDictionary[int, RedisLease] = weakref.WeakValueDictionary()
        # Lease id -> its lease machine model, for the leases this instance was issued (and, briefly, settled:
        # so a second settle the server reports names the state the first left). See _lease_model.
        self._models: dict[int, contract.LeaseModel] = {}
        self._prune_at = 1024  # prune the models once they exceed this (twice those kept at the last prune, + 1024)
        # Samples this instance put and has not seen settled; their settles elsewhere arrive on the feed.
        self._mine: dict[str, SampleRef] = {}
        # The same samples by the exact wire bytes this instance sent: leasing one of them back skips the decode
        # (identical bytes decode to an equal ref; the in-process queue hands out the very object put, too).
        self._sent: dict[bytes, SampleRef] = {}
        self._wire: dict[str, bytes] = {}
        # Ids this instance saw settled, newest last (at most dedup_window): a re-put of one is asked of the server
        # before the store is touched, as the in-process queue refuses it from its dedup window.
        self._settled: collections.OrderedDict[str, None] = collections.OrderedDict()
        # The clock value the last call sent (None: the server's TIME), so a lease's deadline needs no reply field.
        self._sent_now: float | None = None
        self._producing = False
        self._feed_cursor = ""

    def init(self, keep_dead_letter_bytes: int, store_uri: str) -> list[str]:
        """Create the queue on the server or join it: its layout, settings, pinned store and feed position."""
        reply = [reply_text(v) for v in self._run("init", keep_dead_letter_bytes, store_uri)]
        self._feed_cursor = reply[-1]
        return reply[:-1]

    # -- talking to the server -------------------------------------------------
    def _run(self, script: str, *args: str | int | bytes) -> Any:
        """Call one library function with the shared header (see ``_header``)."""
        return self._link.call(script, self._header, *args)

    def _header(self, script: str) -> str:
        """``now`` (empty: the server's TIME), max_deliveries, dedup_window, the feed cursor, the trace flag."""
        if self._server_time:
            self._sent_now = None
            now = ""
        else:
            self._sent_now = float(self._clock())
            now = repr(self._sent_now)
        if self._producing and script in _FEEDING:
            # Holding no unsettled puts, this instance needs no settles from before now, only the newest id.
            return f"{now}{self._settings}{self._feed_cursor if self._mine else '$'}{self._trace_flag}"
        return f"{now}{self._settings}{self._trace_flag}"

    def _token(self) -> str:
        """A fresh token (the server appends an item number to it for the leases or puts of a batch)."""
        return f"{self._token_prefix}{next(self._token_counter)}."

    # -- admitting ----------------------------------------------------------------
    def screen(self, batch: list[SampleRef], check: Callable[[SampleRef], None]) -> None:
        if any(self._known(ref.sample_id) for ref in batch):
            self._check_puts(batch)
        for ref in batch:
            check(ref)

    def _known(self, sample_id: str) -> bool:
        """Whether this instance put ``sample_id`` before (held, settled, or owed a scrub)."""
        return sample_id in self._mine or sample_id in self._settled or self._owes_scrub(sample_id)

    def _check_puts(self, batch: list[SampleRef]) -> None:
        """Before retaining ids this instance put already, or still owes a scrub: the server refuses them first
        (closed, queued, in the dedup window -- counted there) without any store call, as the in-process queue
        does. One extra call, on re-puts only."""
        items = [part for ref in batch for part in (ref.sample_id, "")]
        status, reply_events, *rest = self._run("put_many", "?" + self._token(), *items)
        self._apply(reply_events)
        status = reply_text(status)
        if status != "fresh":
            offending = next((ref for ref in batch if ref.sample_id == reply_text(rest[0])), batch[0])
            raise refusal(status, offending, rest[1])  # nothing was retained: nothing to undo

    def admit(self, batch: list[SampleRef], health: StoreHealth | None, *, if_idle: bool) -> contract.Refusal | None:
        self._producing = True
        if len(batch) == 1:
            return self._put_one(batch[0], health, if_idle)
        wires = [ref_to_json(ref).encode() for ref in batch]
        items: list[str | bytes] = []
        for ref, wire in zip(batch, wires, strict=True):
            items += [ref.sample_id, wire]
        status, reply_events, *rest = self._run("put_many", self._token(), *items)
        self._apply(reply_events)
        status = reply_text(status)
        if status == "ok":
            for ref, wire in zip(batch, wires, strict=True):
                self._remember(ref, wire)
            for ref, settled in zip(batch, rest[0] if rest else (), strict=False):
                self._settled_since(ref, settled)
            return None
        offender, outcome, held = rest
        offending = next((ref for ref in batch if ref.sample_id == reply_text(offender)), batch[0])
        flags = dict(zip((ref.sample_id for ref in batch), (bool(int(flag)) for flag in held), strict=True))
        unretain = [ref for ref in batch if not flags[ref.sample_id] and ref is not offending]
        if not flags[offending.sample_id]:
            unretain.append(offending)
        return contract.Refusal(refusal(status, offending, outcome), tuple(unretain))

    def _put_one(self, ref: SampleRef, health: StoreHealth | None, if_idle: bool) -> contract.Refusal | None:
        wire = ref_to_json(ref).encode()
        status, reply_events, *rest = self._run("put", ref.sample_id, wire, self._token(), "idle" if if_idle else "")
        self._apply(reply_events, put_health=health)
        status = reply_text(status)
        if status == "ok":
            self._remember(ref, wire)
            if rest:
                self._settled_since(ref, rest[0])
            return None
        if status == "busy":
            return contract.Refusal(None, (ref,))
        held = bool(int(rest[0])) if status == "closed" else status in ("held", "kept")
        return contract.Refusal(refusal(status, ref, rest[0] if rest else ""), () if held else (ref,))

    def _settled_since(self, ref: SampleRef, settled: object) -> None:
        """A retried put whose first run's reply was lost: the server says whether the sample settled since
        (``functions``' ``settled_since``). Its settle was fed before this instance knew the sample was its own,
        so this is where its store learns it; a dead letter whose bytes are kept stays retained."""
        if int(settled) == 1:
            self._release(ref)

    def _remember(self, ref: SampleRef, wire: bytes) -> None:
        self._mine[ref.sample_id] = ref
        self._sent[wire] = ref
        self._wire[ref.sample_id] = wire

    def held(self, sample_ids: Sequence[str]) -> set[str]:
        """Which of ``sample_ids`` the queue holds (pending or leased, put by any process); raises when Redis
        cannot tell."""
        if not sample_ids:
            return set()
        found = self._retrying(self._redis.hmget, self._key["refs"], list(sample_ids))
        return {sample_id for sample_id, value in zip(sample_ids, found, strict=True) if value is not None}

    def training_ledger(self, holds: contract.Holds) -> RedisTrainingLedger:
        """A ledger under this queue's key namespace, as durable as the queue."""
        replicated = self._link.replicated if self._link.min_replicas else None
        return RedisTrainingLedger(self._redis, self._link.prefix, self._retrying, holds, replicated)

    # -- leasing --------------------------------------------------------------------
    def lease(self, n: int, wait: float) -> tuple[list[Lease], object | None]:
        """Up to ``n`` leases from one server call; the server registers the caller's wait of ``wait``
        seconds, so a put (in any process) while it lasts wakes it."""
        base = self._token()
        status, reply_events, *rest = self._run("acquire", self._vt_arg, base, n, repr(float(wait)))
        status = reply_text(status)
        if status != "ok":
            self._apply(reply_events)
            return [], (None if status == "drained" else rest)
        if not reply_events:  # nothing else happened (and untraced): each lease is reported as it is issued
            return self._issue(rest, base, None), None
        expected: dict[str, _Expected] = {}
        leases = self._issue(rest, base, expected)
        self._apply(reply_events, expected)
        self._report_unmatched(expected)
        return leases, None

    def wait(self, wake: object, seconds: float) -> None:
        last_wake, until_deadline = (reply_text(v) for v in wake)  # type: ignore[attr-defined]
        block = seconds
        if until_deadline:
            block = min(block, max(float(until_deadline), 0.0))
        # BLOCK 0 would mean forever: wait at least a millisecond.
        block_ms = max(1, math.ceil(block * 1000))
        self._retrying(self._redis.xread, {self._key["wake"]: last_wake}, count=1, block=block_ms)

    def _issue(self, reply: list[Any], base: str, expected: dict[str, _Expected] | None) -> list[Lease]:
        """Leases from the server's ``key, n, ref`` triples; lease i (from 1) has token ``base + str(i)``. Each
        is reported leased now, or (``expected``) at the server's event for it."""
        # The server's deadline is the now it used plus vt: this process's clock, or exactly the now we sent.
        deadline = (self._clock() if self._sent_now is None else self._sent_now) + self._vt.seconds
        leases: list[Lease] = []
        models = self._models
        for index in range(0, len(reply), 3):
            key, n, ref_json = reply[index : index + 3]
            ref = self._sent.get(ref_json)
            lease_id = int(key)
            lease = RedisLease(
                ref=ref if ref is not None else ref_from_json(ref_json),
                deadline=deadline,
                visibility_timeout=self._vt,
                redelivery_count=int(n),
                lease_id=lease_id,
                token=f"{base}{index // 3 + 1}",
            )
            self._issued[lease_id] = lease
            model = models.get(lease_id)
            if model is None:
                model = models[lease_id] = contract.LeaseModel(lease.ref.sample_id, lease_id)
            if expected is None:
                self._report(contract.Leased(model, lease, None))
            else:
                expected[reply_text(key)] = ("lease", lease, model)
            leases.append(lease)
        if len(models) > self._prune_at:
            self._prune_models()
        return leases

    def _prune_models(self) -> None:
        """Forget the models of settled leases and of leases whose object is gone (nothing can settle those
        here any more): the ones still issued and not settled stay (those of the call pruning are still
        ``pending``: they are reported leased once the reply is read)."""
        issued = self._issued
        self._models = {
            lease_id: model for lease_id, model in self._models.items() if model.state in HELD and lease_id in issued
        }

    def _lease_model(self, lease_id: int, trigger: str) -> contract.LeaseModel:
        """The model of a lease this instance was issued, for ``trigger`` the server reported on it; a lease it
        holds no model of cannot have been settled or extended by it: ``IllegalTransition``."""
        model = self._models.get(lease_id)
        if model is None:
            raise errors.IllegalTransition("lease", f"lease {lease_id}", "not issued to this instance", trigger)
        return model

    def _lost(self, lease_id: int) -> None:
        """The server refused this instance's own proof of a lease its model holds as leased: some call this
        instance did not see reclaimed it."""
        model = self._models.get(lease_id)
        if model is not None and model.state == "leased":
            self._report(contract.Reclaimed(model, None))

    def _proof(self, lease: object) -> tuple[str, str, str]:
        """(lease key, token, sample id) to present to the server; the token is empty unless ``lease``
        is the very object this instance issued, so copies and foreign leases are rejected as stale."""
        lease_id = getattr(lease, "lease_id", None)
        if type(lease_id) is not int:
            return "", "", ""
        sample_id = getattr(getattr(lease, "ref", None), "sample_id", "")
        issued = self._issued.get(lease_id)
        token = issued.token if issued is lease and issued is not None else ""
        return f"{lease_id:016d}", token, sample_id if isinstance(sample_id, str) else ""

    # -- settling -------------------------------------------------------------------
    def settle(self, action: str, leases: list[Lease], why: str = "") -> list[bool]:
        """Ack, fail, lose, reject or give back ``leases`` in one server call; each is settled or rejected as stale
        on its own. A reject sends ``why`` (the dead letter's reason) before the leases."""
        trigger = action if action == "ack" or action == "give_back" else "fail"
        proofs = [self._proof(lease) for lease in leases]
        if len(proofs) > 1:
            # A lease repeated in the batch: its second settle is stale, as a second ack() would be.
            seen: set[str] = set()
            for index, (key, _, sample_id) in enumerate(proofs):
                if key in seen:
                    proofs[index] = (key, "", sample_id)
                seen.add(key)
        reason = (why,) if action == "reject" else ()
        raw_statuses, reply_events = self._run(action, *reason, *[part for proof in proofs for part in proof])
        statuses = [reply_text(raw) for raw in raw_statuses]
        expected: dict[str, _Expected] | None = None
        if reply_events:
            # The settles are reported at their events (traced calls get one), so a failed scrub is traced right
            # after its Ack, before a Drain the same call caused; the others right after the call's events.
            expected = {}
            for lease, proof, status in zip(leases, proofs, statuses, strict=True):
                if status == "ok":
                    expected[proof[0]] = (trigger, lease, None)
            self._apply(reply_events, expected)
        for lease, (key, token, sample_id), status in zip(leases, proofs, statuses, strict=True):
            if status == "ok":
                if expected is None or key in expected:
                    self._report(self._settle_event(trigger, lease, None))
            elif status == "again":
                # A retried settle whose first run's reply (and events) was lost: acked, or failed into the
                # dead letters; either way this instance's store is done with the sample.
                trace = {"sample_id": sample_id, "lease_id": lease.lease_id} if self._traced else None
                self._forget(lease.ref)
                model = self._lease_model(lease.lease_id, trigger)
                self._report(contract.Settled(model, trigger, lease.ref, trace, retried=True))
            else:
                if token:
                    self._lost(lease.lease_id)
                self._report(contract.Stale(trigger, lease, _SETTLED_BEFORE if token else _NOT_ISSUED_HERE, None))
            if token:
                self._issued.pop(lease.lease_id, None)
        return [status in ("ok", "again") for status in statuses]

    def extend(self, lease: Lease, seconds: float) -> bool:
        key, token, _ = self._proof(lease)
        status, reply_events, *rest = self._run("extend", key, token, repr(float(seconds)))
        if reply_text(status) != "ok":
            self._apply(reply_events)
            if token:
                self._lost(lease.lease_id)
            return False
        lease.deadline = self._local_deadline(rest[0], rest[1])
        expected: dict[str, _Expected] = {key: ("extend", lease, None)}
        self._apply(reply_events, expected)
        self._report_unmatched(expected)
        return True

    def _local_deadline(self, deadline: object, now: object) -> float:
        """A server deadline in this process's clock: exact under an injected clock, offset from TIME otherwise."""
        if self._server_time:
            return self._clock() + (float(reply_text(deadline)) - float(reply_text(now)))
        return float(reply_text(deadline))

    def reap(self) -> contract.Reaped:
        total = 0
        while True:
            _, reply_events, count, state, held, left = self._run("reclaim")
            self._apply(reply_events)
            if left:  # traced: the state the reclaim left, which a producer's Pause or Resume reports
                self._seen_state = event_state(left)
            total += int(count)
            # One call reaps at most REAP_LIMIT leases, to keep the server responsive.
            if int(count) < functions.REAP_LIMIT:
                return contract.Reaped(total, reply_text(state), bool(int(held)))

    # -- lifecycle and dead-letter repair ---------------------------------------------
    def close(self, cause: str | None) -> None:
        _, reply_events = self._run("close", cause or "")
        self._apply(reply_events)

    def repair(self, action: str, sample_ids: Iterable[str] | None) -> list[str]:
        ids = sample_ids_of(sample_ids)
        return self._requeue(ids) if action == "requeue" else self._purge(ids)

    def _requeue(self, ids: list[str]) -> list[str]:
        status, reply_events, detail = self._run("requeue", self._token(), *ids)
        self._apply(reply_events)
        status = reply_text(status)
        if status == "ok":
            return [reply_text(sample_id) for sample_id in detail]
        raise requeue_refusal(status, reply_text(detail), self._name, self._keep_cap)

    def _purge(self, ids: list[str]) -> list[str]:
        status, reply_events, *rest = self._run("purge", *ids)
        self._apply(reply_events)
        if reply_text(status) != "ok":
            raise errors.NotDeadLetter(reply_text(rest[0]), "purged", self._name)
        purged, released = rest
        if self._store_uri is not None:
            for ref_json in released:
                ref = ref_from_json(ref_json)
                if ref.store_uri == self._store_uri:
                    self._release(ref)
        return [reply_text(sample_id) for sample_id in purged]

    # -- reads -----------------------------------------------------------------------
    def count_pause(self) -> None:
        self._retrying(self._redis.hincrby, self._key["stats"], "producer_pauses", 1)

    def snapshot(self, *, lease_ages: bool = False) -> contract.Snapshot:
        """The queue-wide counters and gauges, and the lifecycle state, in one MULTI/EXEC; ``lease_ages`` reads
        every live lease record too (each holds the server's ``TIME`` when it was leased): O(live leases), by the
        Redis server's clock."""
        counters, outstanding, (state, cause), *ages = self._link.snapshot(lease_records=lease_ages)
        values = {reply_text(k): int(v) for k, v in counters.items()}
        values.update(pending=pending_gauge(values), outstanding=int(outstanding))
        oldest = None
        if ages and ages[0]:
            records, (seconds, micros) = ages
            oldest = max(0.0, seconds + micros / 1e6 - min(lease_issued(record) for record in records))
        return contract.Snapshot(reply_text(state), values, oldest, None if cause is None else reply_text(cause))

    def dead_letters(self, newest: int | None) -> list[DeadLetter]:
        """``newest`` reads (and decodes) just those: O(newest), not O(dead letters)."""
        if newest == 0:  # LRANGE -0 -1 would be every letter
            return []
        letters = self._retrying(self._redis.lrange, self._key["dead"], -newest if newest else 0, -1)
        return [dead_letter_from_json(raw) for raw in letters]

    def trace_state(self) -> dict[str, object]:
        """The queue state this instance's last call reported: exact for this instance, whose lock the coordinator
        holds since that call (another process may have changed the queue since)."""
        return self._seen_state

    # -- the server's events ------------------------------------------------------------
    def _apply(
        self,
        reply_events: list[Any],
        expected: dict[str, _Expected] | None = None,
        put_health: StoreHealth | None = None,
    ) -> None:
        """Report the server's events to the coordinator, in order.

        ``expected``: lease key -> the trigger this call made on that lease, reported (and removed) at the
        server's event for it; ``put_health``: the store read a put was decided on, whose resident bytes its
        Put traces.
        """
        if not reply_events:
            return
        width = self._event_width
        for index in range(0, len(reply_events), width):
            kind = reply_text(reply_events[index])
            if kind == "malformed":  # its raw bytes, maybe not text; the server moved the entry aside: logged once
                logger.warning(
                    "queue %r: pending entry %r is not '<n><TAB><sample id>'; moved aside to %s (reason "
                    "'malformed', its raw bytes kept), never delivered",
                    self._name, reply_events[index + 2], self._key["malformed"],
                )  # fmt: skip
                continue
            first, second = reply_text(reply_events[index + 1]), reply_text(reply_events[index + 2])
            trace: dict[str, object] | None = None
            if width == 4 and kind != "retired":
                trace = event_state(reply_events[index + 3])
                self._seen_state = {name: trace[name] for name in ("pending", "outstanding", "now")}
            if kind in ("lease", "extend", "ack", "fail", "give_back", "reclaim"):
                if trace is not None:
                    trace = {"sample_id": first, "lease_id": int(second), **trace}
                if kind == "reclaim":
                    lease_id = int(second)
                    model = self._models.get(lease_id) or contract.LeaseModel(first, lease_id, "leased")
                    self._report(contract.Reclaimed(model, trace))
                elif expected is not None and second in expected:
                    self._report(self._expected_event(expected.pop(second), trace))
            elif kind == "retired":
                self._feed_cursor = second
                mine = self._mine.get(first)
                if mine is not None:
                    self._release(mine)
            elif kind in ("dead", "kept"):
                dead = dead_letter_from_json(second)
                if kind == "dead":  # a kept one stays retained (and in _mine) until requeued and settled, or purged
                    self._forget(dead.ref)
                kept = kind == "kept"
                self._report(
                    contract.DeadLettered(
                        dead, kept, None if trace is None else {"sample_id": first, "kept": kept, **trace}
                    )
                )
            elif trace is None:
                continue  # an untraced call's event for nothing this instance acts on
            elif kind == "put":
                if put_health is not None:
                    trace = {"sample_id": first, "resident_bytes": put_health.resident_bytes, **trace}
                else:
                    trace = {"sample_id": first, **trace}
                self._report(contract.Admitted(first, trace))
            elif kind == "dedup":
                self._report(contract.DedupRefused(first, {"sample_id": first, **trace}))
            elif kind == "requeue":
                self._report(contract.Requeued(first, {"sample_id": first, **trace}))
            elif kind == "purge":
                self._report(contract.Purged(first, {"sample_id": first, **trace}))
            elif kind in ("stale", "forged"):  # forged: a copy of a live lease, not the object acquire returned
                lease_key = int(second) if second else None
                self._report(
                    contract.Stale(
                        first, None, "", {"op": first, "lease_id": lease_key, "forged": kind == "forged", **trace}
                    )
                )
            elif kind == "close":
                self._report(contract.Closed(trace))
            else:  # drain
                self._report(contract.Drained(trace))

    def _expected_event(self, expected: _Expected, trace: contract.Trace | None) -> contract.Event:
        """The event of a trigger this call made on one of this instance's leases."""
        trigger, lease, model = expected
        if model is None:
            model = self._lease_model(lease.lease_id, trigger)
        if trigger == "lease":
            return contract.Leased(model, lease, trace)
        if trigger == "extend":
            return contract.Extended(model, trace)
        return self._settle_event(trigger, lease, trace, model)

    def _settle_event(
        self, trigger: str, lease: Lease, trace: contract.Trace | None, model: contract.LeaseModel | None = None
    ) -> contract.Settled:
        """The ``Settled`` of this instance's own ack, fail or give-back of ``lease``; an ack's bytes are done with
        here."""
        if model is None:
            model = self._lease_model(lease.lease_id, trigger)
        if trigger == "ack":
            self._forget(lease.ref)
            return contract.Settled(model, "ack", lease.ref, trace)
        return contract.Settled(model, trigger, None, trace)

    def _report_unmatched(self, expected: dict[str, _Expected]) -> None:
        """Report what the server did not (an untraced call gets no events for its own triggers)."""
        for entry in expected.values():
            self._report(self._expected_event(entry, None))

    def _release(self, ref: SampleRef) -> None:
        self._forget(ref)
        self._report(contract.Released(ref))

    def _forget(self, ref: SampleRef) -> None:
        """This instance's store is about to scrub ``ref``: remember it as settled, no longer as put here."""
        if self._dedup_window:
            settled = self._settled
            if ref.sample_id in settled:
                settled.move_to_end(ref.sample_id)
            else:
                settled[ref.sample_id] = None
                if len(settled) > self._dedup_window:
                    settled.popitem(last=False)
        self._mine.pop(ref.sample_id, None)
        self._sent.pop(self._wire.pop(ref.sample_id, b""), None)
