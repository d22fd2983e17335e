"""An untrainable sample (wrong dtype, rank or token count, no supervision) put by hand on the in-process queue:
dead-lettered by the loader with reason ``schema``, never counted as trained (``schema_cases``)."""

from __future__ import annotations

import pytest

from featurestream import LocalFeatureStore, SampleRefQueue
from support.schema_cases import UNTRAINABLE, check_reject, check_untrainable_dead_lettered


@pytest.mark.parametrize("case", UNTRAINABLE)
def test_an_untrainable_sample_is_dead_lettered_with_reason_schema(case: str, caplog: pytest.LogCaptureFixture) -> None:
    store = LocalFeatureStore()
    check_untrainable_dead_lettered(SampleRefQueue(store, max_deliveries=5), store, caplog, [case])


def test_untrainable_samples_among_good_ones_are_each_dead_lettered_once(caplog: pytest.LogCaptureFixture) -> None:
    store = LocalFeatureStore()
    check_untrainable_dead_lettered(SampleRefQueue(store, max_deliveries=5), store, caplog, list(UNTRAINABLE))


def test_reject_dead_letters_at_once_and_keeps_the_bytes_for_a_requeue() -> None:
    store = LocalFeatureStore()
    check_reject(SampleRefQueue(store, max_deliveries=5, keep_dead_letter_bytes=1 << 20), store)
