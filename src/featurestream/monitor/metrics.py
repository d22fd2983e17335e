"""Queue metrics for experiment trackers: a flat dict of numbers with stable keys, and Prometheus exposition.

``queue_metrics(queue)`` reads a ``LeaseQueue`` once; ``MetricsLogger`` hands
the same dict, plus per-second rates, to a sink (``wandb.log``, an
``mlflow.log_metrics`` wrapper, ``print`` ...) every N training steps::

    logger = MetricsLogger(queue, every=50, sink=wandb.log)
    for batch in loader:
        train_step(batch)
        logger.step()

Keys (``docs/operations.md`` is the reference), all under ``prefix`` (default ``featurestream/``):

- gauges ``pending``, ``leased``, ``oldest_lease_age_s`` (0.0 when no lease is out: trackers
  take numbers, not ``None``), ``dead_letters`` (how many are listed now),
  ``producer_paused`` (1 while this process's producer is paused by backpressure, else 0),
  ``closed`` (1 once the queue is closed);
- counters ``<name>_total`` for every ``QueueStats`` counter (``put_total``, ``leased_total``,
  ``acked_total``, ``failed_total``, ``reclaimed_total``, ``dead_lettered_total`` ...);
- rates ``<name>_per_s`` for the same counters: only from ``MetricsLogger`` (and
  ``metrics_from_snapshot`` of a ``StatusWatcher`` snapshot that has rates).

``PrometheusCollector(queue)`` exposes the gauges and counters to
``prometheus_client`` (``pip install 'featurestream[metrics]'``) as
``featurestream_pending``, ``featurestream_acked_total`` ...; Prometheus computes rates itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from featurestream.common.checks import check_count
from featurestream.core.protocol import LeaseQueue
from featurestream.monitor.status import COUNTERS, GAUGES, StatusWatcher, snapshot

__all__ = [
    "DEFAULT_PREFIX",
    "Metrics",
    "MetricsLogger",
    "PrometheusCollector",
    "metrics_from_snapshot",
    "queue_metrics",
]

DEFAULT_PREFIX = "featurestream/"
Metrics = dict[str, float | int]


def metrics_from_snapshot(status: Mapping[str, Any], *, prefix: str = DEFAULT_PREFIX) -> Metrics:
    """The flat metrics of a ``featurestream.monitor.status`` snapshot (rate keys only when it has rates)."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {prefix!r}")
    age = status["oldest_lease_age_s"]
    metrics: Metrics = {f"{prefix}{key}": status[key] for key in GAUGES}
    metrics |= {
        f"{prefix}oldest_lease_age_s": 0.0 if age is None else float(age),
        f"{prefix}dead_letters": status["dead_letters"]["count"],
        f"{prefix}producer_paused": int(status["backpressure"] == "paused"),
        f"{prefix}closed": int(status["lifecycle"] != "open"),
    }
    for name, value in status["counters"].items():
        metrics[f"{prefix}{name}_total"] = value
    for name, rate in (status["rates"] or {}).items():
        metrics[f"{prefix}{name}_per_s"] = rate
    return metrics


def queue_metrics(queue: LeaseQueue, *, prefix: str = DEFAULT_PREFIX) -> Metrics:
    """The queue's gauges and counters now, as a flat ``{key: number}`` dict (no rates: see ``MetricsLogger``)."""
    return metrics_from_snapshot(snapshot(queue, newest_dead_letters=0), prefix=prefix)


class MetricsLogger:
    """Call ``step()`` once per training step; every ``every``-th call sends the queue's metrics to ``sink``.

    The logged dict is ``queue_metrics``' plus ``<counter>_per_s`` rates over
    the interval since the previous log (the first log's rates run from this
    logger's creation, which takes a baseline snapshot). ``sink`` is called
    with the dict in the thread whose ``step()`` completed the interval; a
    sink that raises propagates to that caller. ``clock`` measures the rate
    intervals (inject ``featurestream.testing.FakeClock`` in tests).
    Thread-safe: several consumer threads may share one logger.
    """

    def __init__(
        self,
        queue: LeaseQueue,
        *,
        every: int,
        sink: Callable[[Metrics], object],
        prefix: str = DEFAULT_PREFIX,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_count("every", every, minimum=1)
        if not callable(sink):
            raise TypeError(f"sink must be a callable taking the metrics dict, got {sink!r}")
        if not isinstance(prefix, str):
            raise TypeError(f"prefix must be a str, got {prefix!r}")
        self._watcher = StatusWatcher(queue, newest_dead_letters=0, clock=clock)
        self._watcher.snapshot()  # the baseline the first log's rates are measured from
        self.every = every
        self._sink = sink
        self._prefix = prefix
        self._steps = 0
        self._lock = threading.Lock()

    @property
    def steps(self) -> int:
        """How many times ``step()`` was called."""
        with self._lock:
            return self._steps

    def step(self) -> Metrics | None:
        """Count one training step; on every ``every``-th, log the metrics and return them (else ``None``)."""
        with self._lock:
            self._steps += 1
            if self._steps % self.every:
                return None
        return self.log()

    def log(self) -> Metrics:
        """Send the metrics to the sink now, whatever the step count, and return them."""
        metrics = metrics_from_snapshot(self._watcher.snapshot(), prefix=self._prefix)
        self._sink(metrics)
        return metrics


class PrometheusCollector:
    """A ``prometheus_client`` collector: every scrape reads the queue once and reports its gauges and counters.

    Register it with ``prometheus_client.REGISTRY.register(PrometheusCollector(queue))``
    (or ``register()`` below). Metric names are ``<namespace>_pending``,
    ``<namespace>_leased``, ``<namespace>_oldest_lease_age_seconds``,
    ``<namespace>_dead_letters``, ``<namespace>_producer_paused``,
    ``<namespace>_closed`` (gauges) and ``<namespace>_<counter>_total``
    (counters), each with the constant ``labels`` (e.g. ``{"queue": "run-42"}``).
    Needs ``prometheus_client`` (``pip install 'featurestream[metrics]'``).
    """

    def __init__(
        self, queue: LeaseQueue, *, namespace: str = "featurestream", labels: Mapping[str, str] | None = None
    ) -> None:
        _prometheus()  # fail at construction, not at the first scrape, when the package is missing
        if not isinstance(namespace, str) or not namespace.isidentifier():
            raise ValueError(f"namespace must be an identifier-like str (a metric name prefix), got {namespace!r}")
        labels = dict(labels or {})
        for key, value in labels.items():
            if not isinstance(key, str) or not key.isidentifier() or not isinstance(value, str):
                raise ValueError(f"labels must map identifier str names to str values, got {key!r}: {value!r}")
        if not isinstance(queue, LeaseQueue):
            raise TypeError(f"queue must implement featurestream.core.protocol.LeaseQueue, got {type(queue).__name__}")
        self.queue = queue
        self._namespace = namespace
        self._labels = labels

    def register(self, registry: Any = None) -> PrometheusCollector:
        """Register with ``registry`` (default: ``prometheus_client.REGISTRY``) and return self."""
        (registry if registry is not None else _prometheus().REGISTRY).register(self)
        return self

    def collect(self) -> Iterator[Any]:
        """Yield one metric family per gauge and counter (called by ``prometheus_client`` on every scrape).

        Keeps no state between scrapes, so concurrent scrapes are safe.
        """
        core = _prometheus().core
        status = snapshot(self.queue, newest_dead_letters=0)
        metrics = metrics_from_snapshot(status, prefix="")
        names, values = list(self._labels), list(self._labels.values())
        for key in (*GAUGES, *_EXTRA_GAUGES):
            # Prometheus spells units out: seconds.
            name = key.removesuffix("_s") + "_seconds" if key.endswith("_s") else key
            help_text = _GAUGE_HELP.get(key, f"queue gauge {key}")
            family = core.GaugeMetricFamily(f"{self._namespace}_{name}", help_text, labels=names)
            family.add_metric(values, metrics[key])
            yield family
        for counter in COUNTERS:
            family = core.CounterMetricFamily(
                f"{self._namespace}_{counter}", f"queue {counter} events since the queue was created", labels=names
            )
            family.add_metric(values, metrics[f"{counter}_total"])
            yield family


# The flat gauges metrics_from_snapshot derives beyond the QueueStats gauges, and the help text of each.
_EXTRA_GAUGES = ("oldest_lease_age_s", "dead_letters", "producer_paused", "closed")
_GAUGE_HELP = {
    "pending": "samples waiting to be leased",
    "leased": "samples leased now",
    "scrub_backlog": "settled samples whose store scrub the queue still owes",
    "oldest_lease_age_s": "seconds since the oldest live lease was issued (0 when none is out)",
    "dead_letters": "dead letters listed now",
    "producer_paused": "1 while this process's producer is paused by backpressure",
    "closed": "1 once the queue is closed",
}


def _prometheus() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core
    except ImportError as exc:
        raise ImportError(
            "Prometheus exposition needs prometheus_client: pip install 'featurestream[metrics]' "
            "(or pip install 'prometheus_client>=0.20')"
        ) from exc
    return prometheus_client
