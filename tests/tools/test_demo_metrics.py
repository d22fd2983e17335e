"""``featurestream demo`` logs the queue metrics every N training steps; ``status`` then finds its Redis queue."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from featurestream.cli import main

# No injected faults and a long visibility timeout: every sample is trained on exactly once, so the step count is exact.
CALM = ["--samples", "24", "--fail-rate", "0", "--crash-every", "0", "--visibility-timeout", "60", "--seed", "1"]
METRICS = re.compile(r"^metrics of queue (\S+): (\{.*\})$")


def metrics_lines(err: str) -> list[tuple[str, dict[str, Any]]]:
    return [(found[1], json.loads(found[2])) for line in err.splitlines() if (found := METRICS.match(line))]


def test_demo_prints_metrics_every_n_steps(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *CALM, "--metrics-every", "5"]) == 0
    logged = metrics_lines(capsys.readouterr().err)
    assert len(logged) == 4  # steps 5, 10, 15, 20 of 24
    assert {name for name, _ in logged} == {"in-process"}
    acked = [metrics["featurestream/acked_total"] for _, metrics in logged]
    assert acked == sorted(acked) and acked[-1] <= 24
    assert all("featurestream/acked_per_s" in metrics for _, metrics in logged)


@pytest.mark.parametrize("quiet", [["--metrics-every", "0"], ["--no-progress"]])
def test_demo_metrics_are_off_with_0_or_no_progress(quiet: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", *CALM, "--metrics-every", "5", *quiet]) == 0
    assert metrics_lines(capsys.readouterr().err) == []


def test_status_finds_the_redis_demo_queue_by_the_name_its_metrics_print(
    redis_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
    assert main(["demo", *CALM, "--redis", redis_server.url, "--metrics-every", "10"]) == 0
    logged = metrics_lines(capsys.readouterr().err)
    assert len(logged) == 2
    name = logged[0][0]
    assert name.startswith("demo-")
    assert main(["status", "--redis", redis_server.url, "--name", name, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["lifecycle"] == "drained" and status["counters"]["acked"] == 24
    assert (status["pending"], status["leased"], status["dead_letters"]["count"]) == (0, 0, 0)
