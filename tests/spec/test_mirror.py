"""The mirror's step API: each action's effect, refusals, counters and invariant checks."""

from __future__ import annotations

import pytest

from featurestream.spec.mirror import SpecConstants, SpecMirror


def _mirror(**overrides: object) -> SpecMirror:
    return SpecMirror(SpecConstants(samples=("s1", "s2", "s3"), max_held=None, **overrides))  # type: ignore[arg-type]


def _enqueue(m: SpecMirror, *samples: str) -> None:
    for sample in samples:
        assert m.store_put(sample) and m.put(sample)


def test_fifo_acquire_and_redelivery_to_the_tail() -> None:
    m = _mirror(max_deliveries=3)
    _enqueue(m, "s1", "s2")
    token = m.acquire("c1")
    assert token == ("s1", 0)
    assert m.fail("c1", token)
    assert m.pending_order() == ["s2", "s1"]
    assert m.redelivery_count("s1") == 1
    assert m.acquire("c2") == ("s2", 0)
    assert m.acquire("c2") == ("s1", 1)
    assert m.acquire("c1") is None
    m.check_invariants()


def test_stale_ack_after_reclaim_is_rejected_and_counted() -> None:
    m = _mirror()
    _enqueue(m, "s1")
    old = m.acquire("c1")
    assert old is not None and m.get("c1", "s1")
    assert m.reclaim("s1")
    new = m.acquire("c2")
    assert not m.ack("c1", old)
    assert m.release("c1", "s1")
    assert m.resident() == {"s1"}, "a stale release must not free a queued sample"
    assert m.ack("c2", new)
    assert m.status("s1") == "acked" and m.resident() == set()
    stats = m.stats()
    assert (stats["acked"], stats["reclaimed"], stats["stale_rejected"], stats["leased"]) == (1, 1, 1, 2)
    m.check_invariants()


def test_forged_token_is_rejected() -> None:
    m = _mirror()
    _enqueue(m, "s1")
    assert m.acquire("c1") == ("s1", 0)
    assert not m.ack("c2", ("s1", 0))
    assert m.status("s1") == "leased" and m.stats()["stale_rejected"] == 1


def test_crash_then_ack_by_another_consumer_scrubs_the_bytes() -> None:
    m = _mirror()
    _enqueue(m, "s1")
    assert m.acquire("c1") and m.get("c1", "s1") and m.crash("c1")
    assert m.held("c1") == set() and m.handles("c1") == set()
    assert m.reclaim("s1")
    token = m.acquire("c2")
    assert token is not None and m.get("c2", "s1") and m.release("c2", "s1") and m.ack("c2", token)
    assert m.resident() == set() and m.resident_bytes == 0
    m.check_invariants()


def test_dead_letter_at_max_deliveries_and_dedup_refusal() -> None:
    m = _mirror(max_deliveries=2)
    _enqueue(m, "s1")
    assert m.fail("c1", m.acquire("c1"))  # type: ignore[arg-type]
    assert m.reclaim("s1") is False
    m.acquire("c1")
    assert m.reclaim("s1")
    assert m.status("s1") == "dead" and m.dead_letters() == ["s1"]
    assert not m.reput("s1")
    stats = m.stats()
    assert (stats["dead_lettered"], stats["dedup_refused"], stats["failed"], stats["reclaimed"]) == (1, 1, 1, 1)
    m.check_invariants()


def test_close_refuses_puts_and_drains_after_the_last_settle() -> None:
    m = _mirror()
    _enqueue(m, "s1")
    assert m.store_put("s2")
    assert m.close() and m.lifecycle_state == "draining"
    assert not m.put("s2")
    token = m.acquire("c1")
    assert token is not None and m.ack("c1", token)
    assert m.lifecycle_state == "drained"
    m.check_invariants()


def test_hysteresis_pauses_at_high_and_resumes_at_low() -> None:
    m = _mirror(high_watermark=2, low_watermark=1)
    assert m.store_put("s1") and m.update_backpressure() is None
    assert m.store_put("s2") and m.update_backpressure() == "Pause"
    assert m.backpressure_state == "paused" and m.stats()["producer_pauses"] == 1
    m.put("s1")
    m.put("s2")
    m.ack("c1", m.acquire("c1"))  # type: ignore[arg-type]
    assert m.resident_bytes == 1 and m.update_backpressure() == "Resume"


@pytest.mark.parametrize(
    ("bug", "invariant"),
    [("A", "NoLoss"), ("B", "NoLeak"), ("C", "ExactlyOnce"), ("D", "BoundedDelivery")],
)
def test_bug_switches_break_their_invariant(bug: str, invariant: str) -> None:
    m = SpecMirror(SpecConstants(samples=("s1",), max_held=None, max_deliveries=1, bugs=frozenset(bug)))
    _enqueue(m, "s1")
    token = m.acquire("c1")
    assert token is not None and m.get("c1", "s1")
    if bug == "A":
        m.release("c1", "s1")
    elif bug == "B":
        m.crash("c1")
        m.reclaim("s1")  # with bug B alone the max_deliveries=1 reclaim dead-letters: scrub skipped
    elif bug == "C":
        m.release("c1", "s1")
        m.ack("c1", token)
        m.reput("s1")
    else:
        m.fail("c1", token)
    with pytest.raises(AssertionError, match=invariant):
        m.check_invariants()


def test_unknown_names_are_refused_with_the_name() -> None:
    m = _mirror()
    with pytest.raises(KeyError, match="s9"):
        m.put("s9")
    with pytest.raises(KeyError, match="c9"):
        m.acquire("c9")
    with pytest.raises(ValueError, match="bugs"):
        SpecConstants(bugs=frozenset("Z"))


# -- producers, store faults, the dedup window (issue 9) ------------------------------------------------


def _producers(**overrides: object) -> SpecMirror:
    constants = SpecConstants(
        samples=("s1", "s2", "s3"),
        consumers=("c1",),
        producers=("p1", "p2"),
        max_held=None,
        high_watermark=2,
        low_watermark=1,
        **overrides,  # type: ignore[arg-type]
    )
    return SpecMirror(constants)


def test_two_paused_producers_with_nothing_queued_may_enqueue() -> None:
    """Issue 9's deadlock: both producers store, pause at the high watermark; the fix lets one enqueue."""
    m = _producers()
    assert m.producer_store("p1", "s1") and m.producer_store("p2", "s2")
    assert m.producer_poll("p1") == "Pause" and m.backpressure_state == "paused"
    assert m.may_enqueue(), "nothing is pending or leased: a paused producer may enqueue"
    assert m.producer_poll("p1") == "enqueued" and m.producer_state("p1") == "idle"
    assert m.producer_poll("p2") == "wait", "the queue holds s1 now: p2 waits for it to settle"
    token = m.acquire("c1")
    assert token is not None and m.ack("c1", token)
    assert m.producer_poll("p2") == "Resume"
    assert m.producer_poll("p2") == "enqueued"
    m.check_invariants()


def test_old_rule_strands_both_producers() -> None:
    m = _producers(bugs=frozenset("P"))
    assert m.producer_store("p1", "s1") and m.producer_store("p2", "s2")
    assert m.producer_poll("p1") == "Pause"
    assert not m.may_enqueue()
    assert m.producer_poll("p1") == "wait" and m.producer_poll("p2") == "wait"


def test_close_wakes_waiting_producers_and_their_puts_raise() -> None:
    m = _producers()
    assert m.producer_store("p1", "s1") and m.producer_store("p2", "s2") and m.producer_poll("p1") == "Pause"
    assert m.close() and m.lifecycle_state == "drained"
    m.arm_fault("unretain")
    assert m.producer_poll("p1") == "closed" and m.producer_poll("p2") == "closed"
    assert m.backlog() == {"s1"}, "the failed unretain is owed"
    assert m.producer_discard("p1") and m.producer_discard("p2")
    assert m.resident() == set() and m.resident_bytes == 0, "discard scrubs: the bytes go, unretain owed or not"
    assert not m.finished(), "the owed unretain is still to be retried"
    assert m.retry_backlog() == 1
    assert m.backlog() == set() and m.finished()
    assert [e for e, _ in m.events].count("StoreFault") == 1 and m.stats()["scrub_retries"] == 1
    m.check_invariants()


def test_retain_and_health_faults_refuse_the_put_and_change_nothing() -> None:
    m = _producers()
    assert m.producer_store("p1", "s1")
    before = m.state
    m.arm_fault("retain")
    assert m.producer_poll("p1") == "retain-failed" and m.producer_state("p1") == "aborted"
    assert m.state._replace(pc=before.pc, faults=before.faults) == before, "queue and store unchanged"
    assert m.producer_discard("p1") and m.status("s1") == "discarded" and m.resident() == set()
    assert m.producer_store("p2", "s2")
    m.arm_fault("health")
    assert m.producer_poll("p2") == "health-failed" and m.producer_discard("p2")
    assert m.stats()["store_faults"] == 2 and m.pending_count == 0
    m.check_invariants()


def test_a_failed_scrub_during_ack_leaves_the_ack_standing() -> None:
    """Issue 9's second bug: the settlement stands, the re-put is refused, the scrub is retried."""
    m = _producers()
    assert m.producer_store("p1", "s1") and m.producer_poll("p1") == "enqueued"
    token = m.acquire("c1")
    assert token is not None
    m.arm_fault("scrub")
    assert m.ack("c1", token)
    assert m.status("s1") == "acked" and m.stats()["acked"] == 1
    assert m.resident() == {"s1"} and m.backlog() == {"s1"} and m.dedup_window() == ["s1"]
    assert not m.reput("s1") and m.stats()["dedup_refused"] == 1
    m.arm_fault("gc")
    assert not m.retry_scrub("s1") and m.backlog() == {"s1"}
    assert m.retry_scrub("s1") and m.resident() == set() and m.backlog() == set()
    assert m.close() and m.finished()
    m.check_invariants()


def test_the_old_scrub_fault_behaviour_unsettles_the_sample() -> None:
    m = _producers(bugs=frozenset("S"))
    assert m.producer_store("p1", "s1") and m.producer_poll("p1") == "enqueued"
    token = m.acquire("c1")
    m.arm_fault("scrub")
    assert token is not None and m.ack("c1", token)
    assert m.reput("s1"), "nothing remembers s1: the re-put is accepted"
    with pytest.raises(AssertionError, match="ExactlyOnce"):
        m.check_invariants()


def test_dead_letter_with_a_failed_scrub_is_dead_once() -> None:
    m = _producers(max_deliveries=1)
    assert m.producer_store("p1", "s1") and m.producer_poll("p1") == "enqueued"
    token = m.acquire("c1")
    m.arm_fault("scrub")
    assert token is not None and m.fail("c1", token)
    assert m.dead_letters() == ["s1"] and m.backlog() == {"s1"} and m.stats()["dead_lettered"] == 1
    assert m.retry_backlog() == 1 and m.dead_letters() == ["s1"]
    m.check_invariants()


def test_a_scrub_fault_is_not_spent_on_a_redelivery() -> None:
    m = _producers(max_deliveries=2)
    assert m.producer_store("p1", "s1") and m.producer_poll("p1") == "enqueued"
    token = m.acquire("c1")
    m.arm_fault("scrub")
    assert token is not None and m.fail("c1", token) and m.status("s1") == "pending"
    assert m.armed_faults() == {"scrub": 1}, "a redelivery makes no store call"
    assert m.reclaim("s1") is False
    m.clear_faults()
    assert m.armed_faults() == {}


def test_an_evicted_id_may_be_stored_anew() -> None:
    m = _producers(dedup_window=1)
    for sample in ("s1", "s2"):
        assert m.producer_store("p1", sample) and m.producer_poll("p1") == "enqueued"
        token = m.acquire("c1")
        assert token is not None and m.ack("c1", token)
    assert m.dedup_window() == ["s2"]
    assert not m.reput("s2")
    assert m.producer_store("p1", "s1"), "s1 left the window and the store: a new incarnation"
    assert m.status("s1") == "stored" and m.redelivery_count("s1") == 0
    m.check_invariants()


def test_residency_bound_holds_on_the_producer_path_and_is_skipped_for_direct_puts() -> None:
    m = _producers(sample_bytes=1, large_samples=frozenset({"s3"}), large_bytes=3)
    assert m.producer_store("p1", "s3") and m.producer_poll("p1") == "Pause"
    assert m.producer_poll("p1") == "enqueued", "a sample larger than the watermark still goes into an empty queue"
    m.check_invariants()
    direct = _mirror(high_watermark=2, low_watermark=1)
    _enqueue(direct, "s1", "s2", "s3")
    direct.check_invariants()  # three 1-byte samples queued: over the bound, but put() never blocks


def test_unknown_fault_calls_and_producers_are_refused() -> None:
    m = _producers()
    with pytest.raises(ValueError, match="store call"):
        m.arm_fault("unlink")
    with pytest.raises(KeyError, match="p9"):
        m.producer_store("p9", "s1")


def test_a_kept_dead_letter_is_requeued_with_a_fresh_budget_and_acked_once() -> None:
    m = _mirror(max_deliveries=1, keep_dead=True)
    _enqueue(m, "s1", "s2")
    first = m.acquire("c1")
    assert first is not None and m.fail("c1", first)
    assert m.status("s1") == "dead" and m.kept() == {"s1"} and m.resident() == {"s1", "s2"}
    assert m.dead_letters() == ["s1"] and m.dedup_window() == ["s1"]
    assert not m.reput("s1"), "a put of a kept dead letter is refused"
    m.check_invariants()
    assert m.requeue_dead_letter("s1")
    assert m.pending_order() == ["s2", "s1"] and m.redelivery_count("s1") == 0
    assert m.kept() == set() and m.dead_letters() == [] and m.dedup_window() == []
    m.check_invariants()
    assert m.acquire("c1") == ("s2", 0)
    token = m.acquire("c2")
    assert token == ("s1", 0) and m.ack("c2", token)
    assert m.status("s1") == "acked" and "s1" not in m.resident()
    assert not m.requeue_dead_letter("s1"), "an acked id is never requeued"
    assert m.status("s1") == "acked" and m.stats()["requeued"] == 1
    m.check_invariants()


def test_requeue_is_refused_without_kept_bytes_and_purge_scrubs_kept_ones() -> None:
    m = _mirror(max_deliveries=1)
    _enqueue(m, "s1")
    token = m.acquire("c1")
    assert token is not None and m.fail("c1", token)
    assert m.status("s1") == "dead" and m.resident() == set()
    assert not m.requeue_dead_letter("s1"), "bytes gone: refused"
    assert m.status("s1") == "dead" and m.stats()["requeued"] == 0
    assert m.purge_dead_letter("s1") and m.dead_letters() == [] and not m.purge_dead_letter("s1")
    kept = _mirror(max_deliveries=1, keep_dead=True)
    _enqueue(kept, "s2")
    token = kept.acquire("c1")
    assert token is not None and kept.reclaim("s2") and kept.kept() == {"s2"}
    kept.arm_fault("scrub")
    assert kept.purge_dead_letter("s2")
    assert kept.kept() == set() and kept.backlog() == {"s2"} and kept.resident() == {"s2"}
    assert not kept.requeue_dead_letter("s2"), "purged: no longer a dead letter"
    kept.check_invariants()
    assert kept.retry_scrub("s2") and kept.resident() == set() and kept.stats()["purged"] == 1
    kept.check_invariants()
