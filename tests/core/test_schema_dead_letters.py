"""An untrainable sample (wrong dtype, rank or token count, no supervision) put by hand on the in-process queue:
dead-lettered by the loader with reason ``schema``, never counted as trained (``schema_cases``)."""

from __future__ import annotations

import pytest

from featurestream import LocalFeatureStore, SampleRefQueue

from .schema_cases import check_reject, check_untrainable_dead_lettered


def test_each_untrainable_sample_is_dead_lettered_with_reason_schema(caplog: pytest.LogCaptureFixture) -> None:
    store = LocalFeatureStore()
    check_untrainable_dead_lettered(SampleRefQueue(store, max_deliveries=5), store, caplog)


def test_reject_dead_letters_at_once_and_keeps_the_bytes_for_a_requeue() -> None:
    store = LocalFeatureStore()
    check_reject(SampleRefQueue(store, max_deliveries=5, keep_dead_letter_bytes=1 << 20), store)
