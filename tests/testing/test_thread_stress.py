"""Real threads: every sample ends acked exactly once or dead-lettered, nothing resident, counters add up."""

from __future__ import annotations

import collections

import pytest

from support.stress import run_stress


@pytest.mark.parametrize("seed", [1, 2])
def test_threads_end_with_every_sample_settled_once(seed: int) -> None:
    run = run_stress(seed)
    assert not run.errors, run.errors
    assert not run.hung, f"threads did not finish: {run.hung}"
    assert run.queue.lifecycle_state == "drained"

    acks = collections.Counter(f["sample_id"] for action, f in run.recorder.events if action == "Ack")
    dead = [d.ref.sample_id for d in run.queue.dead_letters()]
    assert max(acks.values()) == 1, [s for s, n in acks.items() if n > 1]
    assert len(dead) == len(set(dead)) and not set(dead) & set(acks)
    assert set(acks) | set(dead) == set(run.sample_ids)

    health = run.store.health()
    assert (health.sample_count, health.resident_bytes) == (0, 0), health
    assert not any(run.store.is_resident(s) for s in run.sample_ids)

    stats = run.queue.stats()
    assert stats.put == len(run.sample_ids) == stats.acked + stats.dead_lettered
    assert stats.leased == stats.acked + stats.failed + stats.reclaimed
    assert stats.leased + stats.pending == stats.put + stats.failed + stats.reclaimed - stats.dead_lettered
    assert (stats.pending, stats.outstanding) == (0, 0)
    assert stats.acked == sum(acks.values()) and stats.dead_lettered == len(dead)
    # the faults really happened: crashes and stalls were reclaimed, some samples ran out of deliveries
    assert stats.reclaimed > 0 and stats.failed > 0 and stats.stale_rejected > 0 and stats.dead_lettered > 0
