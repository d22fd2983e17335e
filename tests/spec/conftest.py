"""Fixtures for the spec tests: TLC availability, one TLC run per model, and the pinned state counts.

Every shipped model and mutant is checked by TLC once per run: ``tlc`` runs each (config, module,
deadlock checking, workers) once per test run, also across pytest-xdist's workers, and ``featurestream check``
(the CLI) reads the same results, so a model's own test and the CLI's test of it share one TLC run.
"""

from __future__ import annotations

import os

import pytest

from featurestream.spec import check
from featurestream.spec.tlc import ToolMissing, find_jar, find_java

from .tlc_runs import tlc

# Distinct states of each shipped exhaustive config; TLC and the Python mirror must both find exactly this many.
CI_DISTINCT_STATES = 27_202  # spec/LeaseQueue.cfg
WINDOW_DISTINCT_STATES = 12_780  # spec/LeaseQueueWindow.cfg (an untrainable sample rejected)
KEEP_DISTINCT_STATES = 5_386  # spec/LeaseQueueKeep.cfg (dead-letter repair, an untrainable sample rejected)
COUNT_DISTINCT_STATES = 30_192  # spec/LeaseQueueCount.cfg (the store's sample-count cap)
LOST_DISTINCT_STATES = 25_528  # spec/LeaseQueueLost.cfg (the store loses a sample's bytes)
GIVE_BACK_DISTINCT_STATES = 37_262  # spec/LeaseQueueGiveBack.cfg (a consumer gives back an unused lease)
DEEP_DISTINCT_STATES = 218_132  # spec/LeaseQueueDeep.cfg (nightly)


@pytest.fixture(scope="session", autouse=True)
def _workers_share_the_runs(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Under pytest-xdist, the run's workers share one results directory beside their own temporary folders."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        tlc.share(tmp_path_factory.getbasetemp().parent / "tlc-runs")


@pytest.fixture(autouse=True)
def _cli_reads_the_session_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """``featurestream check`` runs TLC through the session's runs: a model a test checked is not checked again."""
    monkeypatch.setattr(check, "run_tlc", tlc)


@pytest.fixture(scope="session")
def tlc_available() -> None:
    """Skip (a failure under FEATURESTREAM_REQUIRE_TOOLS=1) when Java or tla2tools.jar is missing."""
    try:
        find_java()
        find_jar()
    except ToolMissing as missing:
        pytest.skip(f"TLC unavailable: {missing}")


@pytest.fixture(scope="session")
def ci_distinct_states() -> int:
    return CI_DISTINCT_STATES


@pytest.fixture(scope="session")
def pinned_states() -> dict[str, int]:
    """Pinned distinct states by config file name."""
    return {
        "LeaseQueue.cfg": CI_DISTINCT_STATES,
        "LeaseQueueWindow.cfg": WINDOW_DISTINCT_STATES,
        "LeaseQueueKeep.cfg": KEEP_DISTINCT_STATES,
        "LeaseQueueCount.cfg": COUNT_DISTINCT_STATES,
        "LeaseQueueLost.cfg": LOST_DISTINCT_STATES,
        "LeaseQueueGiveBack.cfg": GIVE_BACK_DISTINCT_STATES,
        "LeaseQueueDeep.cfg": DEEP_DISTINCT_STATES,
    }
