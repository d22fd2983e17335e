"""``featurestream.monitor.metrics``: the flat metrics dict, the every-N-steps logger and the Prometheus collector."""

from __future__ import annotations

import pytest

from featurestream.monitor.metrics import MetricsLogger, PrometheusCollector, metrics_from_snapshot, queue_metrics
from featurestream.monitor.status import COUNTERS, GAUGES, StatusWatcher
from support.queues import make_queue, put

DERIVED = ("oldest_lease_age_s", "dead_letters", "producer_paused", "closed")
GAUGE_KEYS = {f"featurestream/{key}" for key in (*GAUGES, *DERIVED)}
TOTAL_KEYS = {f"featurestream/{name}_total" for name in COUNTERS}
RATE_KEYS = {f"featurestream/{name}_per_s" for name in COUNTERS}
PROMETHEUS_MISSING = "prometheus_client is missing: pip install 'featurestream[metrics]'"


def test_queue_metrics_are_flat_numbers_with_stable_keys() -> None:
    store, queue, clock = make_queue(max_deliveries=1)
    put(store, queue, "a", "b", "c")
    leases = [queue.acquire(timeout=0) for _ in range(2)]
    assert all(leases)
    queue.fail(leases[0])  # dead
    clock.advance(2.5)
    metrics = queue_metrics(queue)
    assert set(metrics) == GAUGE_KEYS | TOTAL_KEYS
    assert all(type(value) in (int, float) for value in metrics.values())
    assert metrics["featurestream/pending"] == 1
    assert metrics["featurestream/leased"] == 1
    assert metrics["featurestream/oldest_lease_age_s"] == pytest.approx(2.5)
    assert metrics["featurestream/dead_letters"] == 1
    assert metrics["featurestream/put_total"] == 3
    assert metrics["featurestream/leased_total"] == 2
    assert metrics["featurestream/dead_lettered_total"] == 1
    assert metrics["featurestream/producer_paused"] == 0 and metrics["featurestream/closed"] == 0


def test_no_lease_out_reports_age_zero_and_closed_is_one() -> None:
    _, queue, _ = make_queue()
    queue.close()
    metrics = queue_metrics(queue, prefix="fs.")
    assert metrics["fs.oldest_lease_age_s"] == 0.0 and metrics["fs.closed"] == 1


def test_metrics_from_a_watcher_snapshot_carry_rates() -> None:
    store, queue, clock = make_queue()
    watcher = StatusWatcher(queue, clock=clock)
    watcher.snapshot()
    put(store, queue, "a", "b")
    clock.advance(4.0)
    metrics = metrics_from_snapshot(watcher.snapshot())
    assert set(metrics) == GAUGE_KEYS | TOTAL_KEYS | RATE_KEYS
    assert metrics["featurestream/put_per_s"] == pytest.approx(0.5)


def test_logger_logs_every_n_steps_with_rates_since_the_previous_log() -> None:
    store, queue, clock = make_queue()
    logged: list[dict[str, float | int]] = []
    logger = MetricsLogger(queue, every=3, sink=logged.append, clock=clock)
    put(store, queue, "a", "b", "c", "d")
    clock.advance(2.0)
    assert [logger.step() for _ in range(2)] == [None, None] and logged == []
    third = logger.step()
    assert logged == [third] and third is not None
    assert set(third) == GAUGE_KEYS | TOTAL_KEYS | RATE_KEYS
    assert third["featurestream/put_per_s"] == pytest.approx(2.0)  # 4 puts since the logger's baseline, 2 s
    for _ in range(2):
        lease = queue.acquire(timeout=0)
        assert lease is not None
        queue.ack(lease)
    clock.advance(4.0)
    for _ in range(3):
        logger.step()
    assert len(logged) == 2 and logger.steps == 6
    assert logged[1]["featurestream/acked_per_s"] == pytest.approx(0.5)
    assert logged[1]["featurestream/put_per_s"] == 0.0
    assert logged[1]["featurestream/pending"] == 2


def test_log_now_ignores_the_step_count() -> None:
    _, queue, _ = make_queue()
    logged: list[dict[str, float | int]] = []
    logger = MetricsLogger(queue, every=100, sink=logged.append)
    assert logger.log() == logged[0] and logger.steps == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"every": 0}, ValueError, "every must be an int >= 1, got 0"),
        ({"every": True}, ValueError, "every must be an int >= 1, got True"),
        ({"sink": "print"}, TypeError, "sink must be a callable"),
        ({"prefix": 1}, TypeError, "prefix must be a str, got 1"),
    ],
)
def test_logger_refuses_bad_arguments(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    _, queue, _ = make_queue()
    with pytest.raises(error, match=match):
        MetricsLogger(queue, **{"every": 1, "sink": print, **kwargs})  # type: ignore[arg-type]


def test_prometheus_collector_exposes_gauges_and_counters() -> None:
    prometheus_client = pytest.importorskip("prometheus_client", reason=PROMETHEUS_MISSING)
    store, queue, clock = make_queue()
    registry = prometheus_client.CollectorRegistry()
    PrometheusCollector(queue, labels={"queue": "q1"}).register(registry)
    put(store, queue, "a", "b", "c")
    lease = queue.acquire(timeout=0)
    assert lease is not None
    queue.ack(lease)
    queue.acquire(timeout=0)
    clock.advance(1.25)
    labels = {"queue": "q1"}
    assert registry.get_sample_value("featurestream_pending", labels) == 1.0
    assert registry.get_sample_value("featurestream_leased", labels) == 1.0
    assert registry.get_sample_value("featurestream_oldest_lease_age_seconds", labels) == pytest.approx(1.25)
    assert registry.get_sample_value("featurestream_put_total", labels) == 3.0
    assert registry.get_sample_value("featurestream_acked_total", labels) == 1.0
    text = prometheus_client.generate_latest(registry).decode()
    assert "# TYPE featurestream_acked_total counter" in text
    assert "# TYPE featurestream_pending gauge" in text


def test_prometheus_collector_refuses_bad_arguments() -> None:
    pytest.importorskip("prometheus_client", reason=PROMETHEUS_MISSING)
    _, queue, _ = make_queue()
    with pytest.raises(ValueError, match="namespace must be an identifier-like str"):
        PrometheusCollector(queue, namespace="feature stream")
    with pytest.raises(ValueError, match="labels must map"):
        PrometheusCollector(queue, labels={"queue": 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="LeaseQueue, got int"):
        PrometheusCollector(3)  # type: ignore[arg-type]
