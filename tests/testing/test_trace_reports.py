"""A rejected machine trace is reported with the events that led to it, in full."""

from __future__ import annotations

from featurestream.spec.trace import TraceResult
from featurestream.testing import describe_rejections


def _verdict(admitted: bool, stuck_at: dict[str, object] | None) -> TraceResult:
    return TraceResult(admitted, 2, 3, stuck_at, None, "the spec does not allow Put here")  # type: ignore[arg-type]


def test_only_rejected_traces_are_described_with_their_events_up_to_the_stuck_one() -> None:
    long_field = "x" * 400  # never truncated: the log is all a flaky run leaves behind
    traces = [
        [("Put", {"sample_id": "a"})],
        [("Put", {"sample_id": "s0"}), ("Close", {}), ("Put", {"sample_id": "s0", "note": long_field}), ("Drain", {})],
    ]
    verdicts = [_verdict(True, None), _verdict(False, {"index": 2, "action": "Put"})]
    report = describe_rejections(traces, verdicts, context=1)
    assert report.startswith("trace 1: trace REJECTED")
    assert "trace 0" not in report
    assert "event 1: ('Close', {})" in report and long_field in report
    assert "event 0:" not in report and "event 3:" not in report


def test_nothing_to_describe_when_every_trace_is_admitted() -> None:
    assert describe_rejections([[("Put", {"sample_id": "a"})]], [_verdict(True, None)]) == ""
