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
import warnings
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


# Under pytest-xdist (scripts/test.sh: -n with --dist loadscope) the tests of these modules go to one worker: they
# share a module-scoped fixture (an engine run, a Redis cluster, a pytest run of the kit), set up once per worker
# that runs one of them. Every other test goes to whichever worker is free. A worker warns of a module that has such
# a fixture and is not listed.
ONE_WORKER = frozenset(
    {
        "tests/backends/redis/test_redis_demo_sentinel.py",
        "tests/backends/redis/test_redis_failover_stateful.py",
        "tests/backends/redis/test_redis_ha.py",
        "tests/backends/redis/test_redis_stateful.py",
        "tests/pipeline/test_bytes_per_token.py",
        "tests/spec/test_lifecycle.py",
        "tests/testing/test_failure_report.py",
        "tests/tools/test_dot.py",
        "tests/vllm/test_vllm_features.py",
    }
)
# ... and these folders' tests start first: the longest ones (engine processes, TLC runs) are there, and one that
# starts last stretches the whole run.
_LONGEST_FIRST = ("vllm", "spec")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not (os.environ.get("FEATURESTREAM_DEEP") == "1" or "slow" in (config.getoption("markexpr") or "")):
        nightly = [item for item in items if item.get_closest_marker("slow")]
        if nightly:
            config.hook.pytest_deselected(items=nightly)
            items[:] = [item for item in items if not item.get_closest_marker("slow")]
    if hasattr(config, "workerinput"):  # a pytest-xdist worker
        unlisted = {_module(item) for item in items if _shares_a_module_fixture(item)} - ONE_WORKER
        if unlisted:
            warnings.warn(
                f"{sorted(unlisted)} use a module-scoped fixture, set up once per worker that runs one of their "
                "tests: add them to ONE_WORKER in tests/conftest.py",
                stacklevel=1,
            )
        items.sort(key=_start_order)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadscope`` with a scope per module of ``ONE_WORKER`` and per test elsewhere."""
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesSharingAFixture(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return module if module in ONE_WORKER else nodeid

    return ModulesSharingAFixture(config, log)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    definitions = getattr(item, "_fixtureinfo", None)
    chains = definitions.name2fixturedefs.values() if definitions is not None else ()
    return any(chain[-1].scope == "module" for chain in chains)


def _start_order(item: pytest.Item) -> int:
    path = _module(item).split("/")
    folder = path[1] if len(path) > 2 and path[0] == "tests" else ""
    return _LONGEST_FIRST.index(folder) if folder in _LONGEST_FIRST else len(_LONGEST_FIRST)


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
