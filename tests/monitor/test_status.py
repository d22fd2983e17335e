"""``featurestream.monitor.status``: snapshots and rates of an in-process queue, on a fake clock."""

from __future__ import annotations

import json

import pytest

from featurestream import LocalFeatureStore, SampleRefQueue
from featurestream.monitor.status import COUNTERS, GAUGES, StatusWatcher, snapshot
from featurestream.testing import sample_tensors
from support.queues import make_queue, put


def zero_counters() -> dict[str, int]:
    return dict.fromkeys(COUNTERS, 0)


def test_counters_are_the_queue_stats_counters() -> None:
    assert {"put", "leased", "acked", "failed", "reclaimed", "dead_lettered", "producer_pauses"} <= set(COUNTERS)
    assert {"pending", "leased"} <= set(GAUGES) and "outstanding" not in COUNTERS  # gauges are top-level keys


def test_snapshot_of_a_fresh_queue() -> None:
    _, queue, _ = make_queue()
    assert snapshot(queue) == {
        "schema": 1,
        "lifecycle": "open",
        **dict.fromkeys(GAUGES, 0),
        "oldest_lease_age_s": None,
        "counters": zero_counters(),
        "rates": None,
        "interval_s": None,
        "backpressure": "flowing",
        "dead_letters": {"count": 0, "newest": []},
    }


def test_snapshot_during_traffic() -> None:
    store, queue, clock = make_queue(max_deliveries=1)
    put(store, queue, "a", "b", "c", "d", "e")
    first = queue.acquire(timeout=0)
    clock.advance(3.0)
    second = queue.acquire(timeout=0)
    dying = [queue.acquire(timeout=0), queue.acquire(timeout=0)]
    assert first is not None and second is not None and all(dying)
    queue.ack(second)
    for lease in dying:
        queue.fail(lease)  # max_deliveries=1: straight to the dead letters
    clock.advance(1.5)
    status = snapshot(queue, newest_dead_letters=1)
    assert status["pending"] == 1 and status["leased"] == 1
    assert status["oldest_lease_age_s"] == pytest.approx(4.5)  # "a", leased 4.5 s ago
    counters = status["counters"]
    assert (counters["put"], counters["leased"], counters["acked"]) == (5, 4, 1)
    assert (counters["failed"], counters["dead_lettered"], counters["reclaimed"]) == (2, 2, 0)
    dead = status["dead_letters"]
    assert dead["count"] == 2
    assert [letter["sample_id"] for letter in dead["newest"]] == ["d"]  # newest first, capped at 1
    assert dead["newest"][0]["deliveries"] == 1 and dead["newest"][0]["reason"]
    assert [d["sample_id"] for d in snapshot(queue)["dead_letters"]["newest"]] == ["d", "c"]
    json.dumps(status)  # plain data, ready for a log line


def test_dead_letter_count_follows_requeue_and_purge() -> None:
    store, queue, _ = make_queue(max_deliveries=1, keep_dead_letter_bytes=1 << 30)
    put(store, queue, "a", "b", "c")
    for _ in range(3):
        lease = queue.acquire(timeout=0)
        assert lease is not None
        queue.fail(lease)
    assert snapshot(queue)["dead_letters"]["count"] == 3
    assert queue.requeue_dead_letters(["a"]) == ["a"] and queue.purge_dead_letters(["c"]) == ["c"]
    status = snapshot(queue)
    assert status["dead_letters"] == {
        "count": 1,
        "newest": [{"sample_id": "b", "reason": queue.dead_letters()[0].reason, "deliveries": 1}],
    }
    assert (status["counters"]["requeued"], status["counters"]["purged"], status["pending"]) == (1, 1, 1)
    assert snapshot(queue, newest_dead_letters=0)["dead_letters"] == {"count": 1, "newest": []}


def test_snapshot_reads_only_the_newest_dead_letters(monkeypatch: pytest.MonkeyPatch) -> None:
    store, queue, _ = make_queue(max_deliveries=1)
    put(store, queue, "a", "b", "c")
    for _ in range(3):
        lease = queue.acquire(timeout=0)
        assert lease is not None
        queue.fail(lease)
    assert [d.ref.sample_id for d in queue.dead_letters(newest=2)] == ["b", "c"]  # oldest first
    assert queue.dead_letters(newest=5) == queue.dead_letters() and queue.dead_letters(newest=0) == []
    with pytest.raises(ValueError, match="newest must be an int >= 0, got -1"):
        queue.dead_letters(newest=-1)
    asked: list[int | None] = []
    read = queue.dead_letters
    monkeypatch.setattr(queue, "dead_letters", lambda newest=None: asked.append(newest) or read(newest))
    assert [d["sample_id"] for d in snapshot(queue, newest_dead_letters=2)["dead_letters"]["newest"]] == ["c", "b"]
    snapshot(queue, newest_dead_letters=0)
    assert asked == [2]  # only the newest two were read; none for a snapshot that lists none


def test_oldest_lease_age_follows_the_oldest_live_lease() -> None:
    store, queue, clock = make_queue()
    put(store, queue, "a", "b")
    first = queue.acquire(timeout=0)
    clock.advance(2.0)
    second = queue.acquire(timeout=0)
    clock.advance(1.0)
    assert first is not None and second is not None
    assert snapshot(queue)["oldest_lease_age_s"] == pytest.approx(3.0)
    queue.ack(first)
    assert snapshot(queue)["oldest_lease_age_s"] == pytest.approx(1.0)
    queue.ack(second)
    assert snapshot(queue)["oldest_lease_age_s"] is None


def test_lifecycle_follows_close_and_drain() -> None:
    store, queue, _ = make_queue()
    put(store, queue, "a")
    queue.close()
    assert snapshot(queue)["lifecycle"] == "draining"
    lease = queue.acquire(timeout=0)
    assert lease is not None
    queue.ack(lease)
    assert snapshot(queue)["lifecycle"] == "drained"


def test_watcher_rates_over_the_interval_since_its_previous_snapshot() -> None:
    store, queue, clock = make_queue()
    watcher = StatusWatcher(queue, clock=clock)
    put(store, queue, "a", "b", "c", "d")
    first = watcher.snapshot()
    assert first["rates"] is None and first["interval_s"] is None
    leases = [queue.acquire(timeout=0) for _ in range(4)]
    for lease in leases[:3]:
        assert lease is not None
        queue.ack(lease)
    clock.advance(2.0)
    second = watcher.snapshot()
    assert second["interval_s"] == pytest.approx(2.0)
    assert second["rates"]["acked"] == pytest.approx(1.5)
    assert second["rates"]["leased"] == pytest.approx(2.0)
    assert second["rates"]["put"] == 0.0  # the puts happened before the first snapshot
    assert set(second["rates"]) == set(COUNTERS)
    third = watcher.snapshot()  # same clock tick: no measurable interval
    assert third["interval_s"] == 0.0 and set(third["rates"].values()) == {0.0}


def test_backpressure_state_is_reported_or_withheld() -> None:
    store = LocalFeatureStore(max_samples=None, max_bytes=1 << 30)
    size = store.put("probe", sample_tensors(0, tokens=8), run_id="run").estimated_bytes
    queue = SampleRefQueue(store, high_watermark_bytes=2 * size, low_watermark_bytes=size)
    blocked = store.put("blocked", sample_tensors(1, tokens=8), run_id="run")
    calls = iter([False, True])
    # Probe + blocked are resident (2 * size): the producer pauses, then its abort_when ends the wait.
    with pytest.raises(RuntimeError, match="aborted"):
        queue.put_blocks_until_below(blocked, poll_interval=0, abort_when=lambda: next(calls))
    status = snapshot(queue)
    assert status["backpressure"] == "paused" and status["counters"]["producer_pauses"] == 1
    assert snapshot(queue, backpressure=False)["backpressure"] is None
    assert StatusWatcher(queue, backpressure=False).snapshot()["backpressure"] is None


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"newest_dead_letters": -1}, ValueError, "newest_dead_letters must be an int >= 0, got -1"),
        ({"newest_dead_letters": True}, ValueError, "newest_dead_letters must be an int >= 0, got True"),
        ({"backpressure": 1}, TypeError, "backpressure must be a bool, got 1"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    _, queue, _ = make_queue()
    with pytest.raises(error, match=match):
        snapshot(queue, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(error, match=match):
        StatusWatcher(queue, **kwargs)  # type: ignore[arg-type]


def test_a_non_queue_is_refused() -> None:
    with pytest.raises(TypeError, match="LeaseQueue, got dict"):
        snapshot({})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="LeaseQueue, got str"):
        StatusWatcher("queue")  # type: ignore[arg-type]
    _, queue, _ = make_queue()
    with pytest.raises(TypeError, match="clock must be a callable"):
        StatusWatcher(queue, clock=1.0)  # type: ignore[arg-type]
