"""An untrainable sample put by hand on a Redis queue: dead-lettered by the loader with reason ``schema``, never
counted as trained, as on the in-process queue (``tests/support/schema_cases.py``); ``featurestream status`` says so."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from featurestream import LocalFeatureStore
from featurestream.cli import main
from support.schema_cases import UNTRAINABLE, check_reject, check_untrainable_dead_lettered


@pytest.mark.parametrize("case", UNTRAINABLE)
def test_an_untrainable_sample_is_dead_lettered_with_reason_schema(
    make: Callable[..., Any], case: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = LocalFeatureStore()
    check_untrainable_dead_lettered(make(store, max_deliveries=5), store, caplog, [case])


def test_untrainable_samples_among_good_ones_are_dead_lettered_and_status_says_so(
    make: Callable[..., Any],
    redis_server: Any,
    queue_name: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = LocalFeatureStore()
    check_untrainable_dead_lettered(make(store, max_deliveries=5), store, caplog, list(UNTRAINABLE))
    capsys.readouterr()
    assert main(["status", "--redis", redis_server.url, "--name", queue_name, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["counters"]["acked"] == 2 and status["dead_letters"]["count"] == len(UNTRAINABLE)
    assert all(entry["reason"].startswith("schema: sample ") for entry in status["dead_letters"]["newest"])


def test_reject_dead_letters_at_once_and_keeps_the_bytes_for_a_requeue(make: Callable[..., Any]) -> None:
    store = LocalFeatureStore()
    check_reject(make(store, max_deliveries=5, keep_dead_letter_bytes=1 << 20), store)
