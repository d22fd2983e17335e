"""Shared test configuration.

``FEATURESTREAM_REQUIRE_TOOLS=1`` (set by CI) turns every skip into a
failure, so a missing TLC, graphviz or redis-server cannot pass silently;
but a test marked ``gpu`` may skip: a machine without a GPU misses no tool.

Tests marked ``slow`` run nightly only (``tox -e deep``): they are deselected
unless ``FEATURESTREAM_DEEP=1`` or a ``-m`` expression naming ``slow`` asks for
them. Deselection, not a skip, so CI's no-skip rule does not turn the
nightly-only run into a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

from featurestream.testing.profiles import load_profile

STRICT_TOOLS = os.environ.get("FEATURESTREAM_REQUIRE_TOOLS") == "1"

# ``ci`` and ``deep`` ship with featurestream.testing; ``dev`` is this project's own. Importing the kit loads
# nothing: the suite loads the profile HYPOTHESIS_PROFILE names (.ci/run: ci), else ci.
settings.register_profile("dev", max_examples=50, stateful_step_count=30, deadline=None, print_blob=True)
load_profile()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("FEATURESTREAM_DEEP") == "1" or "slow" in (config.getoption("markexpr") or ""):
        return
    nightly = [item for item in items if item.get_closest_marker("slow")]
    if nightly:
        config.hook.pytest_deselected(items=nightly)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if STRICT_TOOLS and report.skipped and not hasattr(report, "wasxfail") and not item.get_closest_marker("gpu"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped under FEATURESTREAM_REQUIRE_TOOLS=1 (CI forbids skips): {reason}"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real in-memory ``redis-server`` shared by the session's tests; each test uses its own queue name."""
    from support.redis_server import RedisServer  # skips here, not at collection, where redis-py is missing

    with RedisServer(tmp_path_factory.mktemp("redis"), appendonly=False) as server:
        yield server
