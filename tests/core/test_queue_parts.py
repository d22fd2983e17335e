"""The parts both queue backends share (core.backpressure, core.backlog, core.locked_call, core.arguments)."""

from __future__ import annotations

import collections
import threading

import pytest

from featurestream import LocalFeatureStore, SampleRef, StoreHealth
from featurestream.core import events
from featurestream.core.arguments import check_queue_arguments
from featurestream.core.backlog import Owed, call_or_owe, pay_owed
from featurestream.core.backpressure import Backpressure
from featurestream.core.locked_call import LockedCall
from featurestream.testing import FaultyStore
from support.samples import put_sample


def health(resident_bytes: int, high_hit: bool = False, low_hit: bool = False) -> StoreHealth:
    return StoreHealth(resident_bytes, 1000, 1, high_hit, low_hit)


def test_backpressure_hysteresis_pauses_at_high_resumes_at_low_and_holds_inside_the_band() -> None:
    seen: list[tuple[str, int]] = []
    bp = Backpressure(100, 50, lambda h: seen.append(("pause", h.resident_bytes)), None)
    assert bp.step(health(99)) is None and bp.state == "flowing"
    event, callback = bp.step(health(100)) or ("", None)
    assert (event, bp.state) == (events.PAUSE, "paused")
    assert callback is not None
    callback(health(100))
    assert seen == [("pause", 100)]
    assert bp.step(health(200)) is None and bp.step(health(51)) is None and bp.state == "paused"
    step = bp.step(health(50))
    assert step is not None and step[0] == events.RESUME and bp.state == "flowing"
    step[1](health(50))  # an unset on_resume is a callable that does nothing


def test_backpressure_without_watermarks_follows_the_store_flags() -> None:
    bp = Backpressure(None, None, None, None)
    assert bp.step(health(10**9)) is None
    assert bp.should_pause(health(0, high_hit=True))
    step = bp.step(health(0, high_hit=True))
    assert step is not None and step[0] == events.PAUSE
    assert bp.step(health(0)) is None and bp.state == "paused"
    assert bp.step(health(0, low_hit=True)) is not None and bp.state == "flowing"


@pytest.mark.parametrize(
    ("changes", "error", "names"),
    [
        ({"store": object()}, TypeError, "store"),
        ({"visibility_timeout": 3.0}, TypeError, "visibility_timeout"),
        ({"high_watermark_bytes": True}, ValueError, "high_watermark_bytes"),
        ({"high_watermark_bytes": 10, "low_watermark_bytes": 10}, ValueError, "low_watermark_bytes (10)"),
        ({"max_deliveries": 0}, ValueError, "max_deliveries"),
        ({"dedup_window": -1}, ValueError, "dedup_window"),
        ({"keep_dead_letter_bytes": 1.5}, ValueError, "keep_dead_letter_bytes"),
        ({"reaper_interval": 0}, ValueError, "reaper_interval"),
    ],
)
def test_queue_arguments_name_the_bad_one(changes: dict[str, object], error: type[Exception], names: str) -> None:
    arguments: dict[str, object] = {
        "store": LocalFeatureStore(),
        "visibility_timeout": None,
        "high_watermark_bytes": None,
        "low_watermark_bytes": None,
        "max_deliveries": 1,
        "dedup_window": 0,
        "keep_dead_letter_bytes": 0,
        "reaper_interval": None,
    }
    check_queue_arguments(**arguments)  # type: ignore[arg-type]
    with pytest.raises(error, match=names.replace("(", r"\(").replace(")", r"\)")):
        check_queue_arguments(**{**arguments, **changes})  # type: ignore[arg-type]


def refs(store: FaultyStore, count: int) -> list[SampleRef]:
    return [put_sample(store, f"s{i}") for i in range(count)]


def test_owed_calls_are_retried_oldest_first_and_a_failure_ends_the_round() -> None:
    store = FaultyStore(LocalFeatureStore())
    first, second, third = refs(store, 3)
    for ref in (first, second, third):
        store.retain(ref)
    owed: Owed = collections.OrderedDict()
    faults: list[tuple[str, str | None]] = []
    paid: list[tuple[str, str]] = []

    def on_fault(call: str, sample_id: str | None, exc: BaseException) -> None:
        faults.append((call, sample_id))

    store.arm("scrub", times=2)
    assert not call_or_owe(store, owed, "scrub", first, on_fault)
    assert not call_or_owe(store, owed, "scrub", second, on_fault)
    assert call_or_owe(store, owed, "scrub", third, on_fault)
    assert list(owed) == ["s0", "s1"] and faults == [("scrub", "s0"), ("scrub", "s1")]
    store.arm("scrub", times=1)
    pay_owed(store, owed, on_fault, lambda sample_id, call: paid.append((sample_id, call)))
    assert paid == [] and list(owed) == ["s1", "s0"], "the failed retry goes to the back and ends the round"
    pay_owed(store, owed, on_fault, lambda sample_id, call: paid.append((sample_id, call)))
    assert paid == [("s1", "scrub"), ("s0", "scrub")] and not owed
    assert not store.is_resident("s0") and not store.is_resident("s1")


class _Queue:
    """What an LockedCall is given, with a store whose gc is counted."""

    def __init__(self) -> None:
        self.store = FaultyStore(LocalFeatureStore())
        self.lock = threading.Lock()
        self.owed: Owed = collections.OrderedDict()
        self.faults: list[str] = []
        self.paid_rounds = 0
        self.op = LockedCall(self.lock, self.store, self.owed, self.pay_owed, self.store_fault)

    def pay_owed(self) -> None:
        self.paid_rounds += 1
        raise KeyboardInterrupt("a retry that raises past the queue's own handling")

    def store_fault(self, call: str, sample_id: str | None, exc: BaseException) -> None:
        self.faults.append(call)


def test_an_operation_runs_callbacks_and_gc_outside_the_lock_even_when_its_body_raises() -> None:
    queue = _Queue()
    op = queue.op
    ran: list[bool] = []
    queue.store.arm("gc")
    with pytest.raises(ZeroDivisionError), op:
        op.defer(lambda held: ran.append(queue.lock.locked()), None)
        1 / 0  # noqa: B018
    assert ran == [False], "the callback ran, after the lock was released"
    assert queue.faults == ["gc"] and not queue.lock.locked()
    with op:
        pass
    assert ran == [False], "a callback runs once: the next operation starts with none deferred"


def test_an_operation_whose_owed_retry_raises_releases_the_lock() -> None:
    queue = _Queue()
    queue.owed["s0"] = ("scrub", put_sample(queue.store, "s0"))
    with pytest.raises(KeyboardInterrupt), queue.op:
        pytest.fail("the body must not run")
    assert queue.paid_rounds == 1 and not queue.lock.locked()
    with pytest.raises(KeyboardInterrupt), queue.op.reading():
        pytest.fail("the body must not run")
    assert queue.paid_rounds == 2 and not queue.lock.locked()
