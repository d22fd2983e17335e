"""Fixtures for the spec tests: TLC availability and the pinned state counts.

Tests marked ``slow`` here (the deep TLC model) are deselected unless
``FEATURESTREAM_DEEP=1`` or ``-m slow`` asks for them: deselection, not a skip,
so CI's no-skip rule does not turn the nightly-only run into a failure.
"""

from __future__ import annotations

import os

import pytest

from featurestream.spec.tlc import ToolMissing, find_jar, find_java

# Distinct states of each shipped exhaustive config; TLC and the Python mirror must both find exactly this many.
CI_DISTINCT_STATES = 27_202  # spec/LeaseQueue.cfg
WINDOW_DISTINCT_STATES = 15_476  # spec/LeaseQueueWindow.cfg
KEEP_DISTINCT_STATES = 6_276  # spec/LeaseQueueKeep.cfg (dead-letter repair)
COUNT_DISTINCT_STATES = 30_192  # spec/LeaseQueueCount.cfg (the store's sample-count cap)
LOST_DISTINCT_STATES = 25_528  # spec/LeaseQueueLost.cfg (the store loses a sample's bytes)
DEEP_DISTINCT_STATES = 218_132  # spec/LeaseQueueDeep.cfg (nightly)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("FEATURESTREAM_DEEP") == "1" or "slow" in (config.getoption("markexpr") or ""):
        return
    here = os.path.dirname(__file__)
    deselected = [item for item in items if item.get_closest_marker("slow") and str(item.path).startswith(here)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]


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
        "LeaseQueueDeep.cfg": DEEP_DISTINCT_STATES,
    }
