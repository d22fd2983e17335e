"""An in-process queue on a fake clock, and a way to put samples into it."""

from __future__ import annotations

from featurestream import LocalFeatureStore, SampleRefQueue, VisibilityTimeout
from featurestream.testing import FakeClock, sample_tensors


def make_queue(**kwargs: object) -> tuple[LocalFeatureStore, SampleRefQueue, FakeClock]:
    store = LocalFeatureStore(max_samples=None, max_bytes=1 << 30)
    clock = FakeClock(1000.0)
    queue = SampleRefQueue(store, VisibilityTimeout(10.0), clock=clock, **kwargs)  # type: ignore[arg-type]
    return store, queue, clock


def put(store: LocalFeatureStore, queue: SampleRefQueue, *ids: str) -> None:
    for index, sample_id in enumerate(ids):
        queue.put(store.put(sample_id, sample_tensors(index), run_id="run"))
