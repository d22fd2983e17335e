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
