"""The sample lifecycle, as data: one sample from the producer's store write to acked / dead / discarded.

``SAMPLE`` is a ``featurestream.core.machines.MachineTable`` over the states of
``sample_state`` -- a projection of a ``spec/LeaseQueue.tla`` state onto one
sample: its queue status, refined by where its bytes are (``RESIDENCY``) and,
while it is not queued yet, by what its producer is doing (waiting while the
queue flows, waiting paused by backpressure, its put raised). Each transition
names the spec action (``spec_action``) that takes it; a test
(``tests/spec/test_lifecycle.py``) checks that the table's edges are exactly the
edges the spec mirror takes in its reachable graph, and its states exactly the
projections of the reachable states -- so the diagram rendered from it for design
review cannot drift from the spec.

Reading it: ``stored`` -> (``paused`` <-> ``stored`` while the producer waits)
-> ``pending`` (queued) -> ``leased`` -> ``acked`` / back to ``pending``
(redelivered) / ``dead`` (dead-lettered; at once by ``reject`` when the
loader's schema refuses it). A store call that fails leaves the settlement
standing and the bytes owed (``acked-owed``, ``dead-owed``): the
scrub is retried until they leave. With ``keep_dead_letter_bytes`` a dead
letter keeps its bytes (``dead-kept``): ``requeue_dead_letters`` sends it back
to ``pending`` with a fresh delivery budget, ``purge_dead_letters`` scrubs it
(to ``dead``, or ``dead-owed`` when the scrub fails). A producer whose put raises (abort, close,
a failed ``health`` or ``retain``) discards the sample. Settled ids come back
to ``stored`` only once evicted from the dedup window, with their bytes gone.
"""

from __future__ import annotations

from featurestream.core.machines import MachineTable, Transition
from featurestream.spec.mirror import NO_SAMPLE, SpecState

__all__ = ["RESIDENCY", "SAMPLE", "sample_state"]

# Where each lifecycle state's bytes are (FeatureStore residency).
RESIDENCY: dict[str, str] = {
    "absent": "not in the store",
    "stored": "resident, not retained (the producer's own bytes; they count toward the watermarks)",
    "paused": "resident, not retained (the producer is paused by backpressure)",
    "raised": "resident, not retained, until the producer discards it",
    "raised-retained": "resident and still retained: the unretain of the refused put failed and is owed",
    "pending": "retained: kept whatever handles are released",
    "leased": "retained: kept whatever handles are released",
    "acked": "scrubbed: gone, whatever handles are out",
    "acked-owed": "resident: the scrub failed and is retried (the ack stands)",
    "dead": "scrubbed: gone, whatever handles are out",
    "dead-owed": "resident: the scrub failed and is retried (the dead letter stands)",
    "dead-kept": "retained: keep_dead_letter_bytes keeps the dead letter's bytes for a requeue, until purged",
    "discarded": "evicted by the producer: gone",
    "discarded-owed": "evicted by the producer: gone; the owed unretain is retried and finds nothing to do",
}

_RETRY = "retry_scrub() / any later queue operation / gc"
_PUT = "put_blocks_until_below()"

SAMPLE = MachineTable(
    name="sample",
    states=tuple(RESIDENCY),
    initial="absent",
    terminal=("acked", "dead", "discarded"),
    transitions=(
        # the producer writes the store and waits in put_blocks_until_below
        Transition("store", "absent", "stored", "FeatureStore.put()", "queue open, flowing", "ProducerStore"),
        Transition("store", "absent", "paused", "FeatureStore.put()", "queue open, paused", "ProducerStore"),
        Transition(
            "store_again", "acked", "stored", "FeatureStore.put()", "id evicted from the dedup window", "ProducerStore"
        ),
        Transition(
            "store_again", "acked", "paused", "FeatureStore.put()", "id evicted, queue paused", "ProducerStore"
        ),
        Transition(
            "store_again", "dead", "stored", "FeatureStore.put()", "id evicted from the dedup window", "ProducerStore"
        ),
        Transition("store_again", "dead", "paused", "FeatureStore.put()", "id evicted, queue paused", "ProducerStore"),
        Transition("pause", "stored", "paused", _PUT, "resident bytes >= high watermark", "PauseP"),
        Transition("resume", "paused", "stored", _PUT, "resident bytes <= low watermark", "ResumeP"),
        Transition("enqueue", "stored", "pending", _PUT, "flowing and below the high watermark", "Enqueue"),
        Transition("enqueue", "paused", "pending", _PUT, "nothing pending or leased (the fix)", "Enqueue"),
        # the producer's put raises: it discards the sample
        *(
            Transition(trigger, source, "raised", method, guard, action)
            for source in ("stored", "paused")
            for trigger, method, guard, action in (
                ("abort", _PUT, "abort_when() returned True", "Abort"),
                ("health_fails", "FeatureStore.health()", "the store call raised", "HealthFails"),
                ("retain_fails", "FeatureStore.retain()", "the store call raised: put refused", "RetainFails"),
                ("close_raises", "close()", "the queue closed while the producer waited", "ClosedRaise"),
            )
        ),
        Transition(
            "close_raises_unretain_fails", "stored", "raised-retained", "FeatureStore.unretain()",
            "closed after retain; the unretain raised", "ClosedRaise",
        ),
        Transition(
            "close_raises_unretain_fails", "paused", "raised-retained", "FeatureStore.unretain()",
            "closed after retain; the unretain raised", "ClosedRaise",
        ),
        Transition("retry_unretain", "raised-retained", "raised", _RETRY, "the unretain goes through", "RetryScrub"),
        Transition("discard", "raised", "discarded", "the producer's eviction", "its put raised", "Discard"),
        Transition("discard", "raised-retained", "discarded-owed", "eviction", "unretain owed", "Discard"),
        Transition("retry_unretain", "discarded-owed", "discarded", _RETRY, "the unretain goes through", "RetryScrub"),
        # the queue's lease lifecycle
        Transition("lease", "pending", "leased", "acquire()", "head of the pending FIFO", "Acquire"),
        Transition("ack", "leased", "acked", "ack(lease)", "live lease; scrub succeeds", "Ack"),
        Transition("ack_scrub_fails", "leased", "acked-owed", "ack(lease)", "live lease; scrub raised", "Ack"),
        Transition("fail", "leased", "pending", "fail(lease)", "deliveries left: to the tail", "Fail"),
        Transition("fail_dead_letter", "leased", "dead", "fail(lease)", "max_deliveries spent; scrub succeeds", "Fail"),
        Transition(
            "fail_dead_letter_scrub_fails", "leased", "dead-owed", "fail(lease)", "max_deliveries spent; scrub raised",
            "Fail",
        ),
        Transition("reject", "leased", "dead", "reject(lease, why)", "schema refuses it; scrub succeeds", "Reject"),
        Transition("reject_scrub_fails", "leased", "dead-owed", "reject(lease, why)", "scrub raised", "Reject"),
        Transition(
            "reclaim", "leased", "pending", "reclaim_expired() / any call", "deadline passed: to the tail", "Reclaim"
        ),
        Transition(
            "reclaim_dead_letter", "leased", "dead", "reclaim_expired() / any call", "deadline passed, none left",
            "Reclaim",
        ),
        Transition(
            "reclaim_dead_letter_scrub_fails", "leased", "dead-owed", "reclaim_expired() / any call",
            "deadline passed, max_deliveries spent; scrub raised", "Reclaim",
        ),
        Transition("retry_scrub", "acked-owed", "acked", _RETRY, "the scrub goes through", "RetryScrub"),
        Transition("retry_scrub", "dead-owed", "dead", _RETRY, "the scrub goes through", "RetryScrub"),
        # dead-letter repair (keep_dead_letter_bytes > 0)
        Transition(
            "fail_dead_letter_kept", "leased", "dead-kept", "fail(lease)", "max_deliveries spent; bytes kept", "Fail"
        ),
        Transition(
            "reclaim_dead_letter_kept", "leased", "dead-kept", "reclaim_expired() / any call",
            "deadline passed, max_deliveries spent; bytes kept", "Reclaim",
        ),
        Transition(
            "requeue", "dead-kept", "pending", "requeue_dead_letters()", "bytes kept: a fresh delivery budget",
            "RequeueDeadLetter",
        ),
        Transition(
            "reject_kept", "leased", "dead-kept", "reject(lease, why)", "schema refuses it; bytes kept", "Reject"
        ),
        Transition("purge", "dead-kept", "dead", "purge_dead_letters()", "scrub succeeds", "PurgeDeadLetter"),
        Transition(
            "purge_scrub_fails", "dead-kept", "dead-owed", "purge_dead_letters()", "scrub raised", "PurgeDeadLetter"
        ),
    ),
)  # fmt: skip


def sample_state(state: SpecState, sample: int) -> str:
    """The ``SAMPLE`` state of sample index ``sample`` in a spec (mirror) state."""
    status = state.status[sample]
    if status == "stored":
        owners = [p for p, owned in enumerate(state.owns) if owned == sample and owned != NO_SAMPLE]
        if not owners:  # stored without a producer process (the step API's store_put)
            return "stored"
        if state.pc[owners[0]] == "waiting":
            return "paused" if state.backpressure == "paused" else "stored"
        return "raised-retained" if sample in state.backlog else "raised"
    if status == "dead" and sample in state.kept:
        return "dead-kept"
    if status in ("acked", "dead", "discarded"):
        return f"{status}-owed" if sample in state.backlog else status
    return status
