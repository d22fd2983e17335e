"""A real ``mooncake_master`` for the Mooncake store's tests (no fakes), started on 127.0.0.1 with free ports."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from featurestream.tools.mooncake import MooncakeMaster, missing_reason


def _require_mooncake() -> None:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def mooncake_master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MooncakeMaster]:
    """One master shared by the tests; each test keeps to its own namespace."""
    _require_mooncake()
    with MooncakeMaster(log=tmp_path_factory.mktemp("mooncake") / "master.log") as master:
        yield master


@pytest.fixture
def own_master(tmp_path: Path) -> Iterator[MooncakeMaster]:
    """A master of this test's own (to kill and restart), with a 2 s client TTL so a dead client's bytes go fast."""
    _require_mooncake()
    master = MooncakeMaster(client_ttl=2, log=tmp_path / "master.log")
    master.start()
    yield master
    master.stop(kill=True)


@pytest.fixture
def namespace() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def make_store(mooncake_master: MooncakeMaster, namespace: str) -> Iterator[Callable[..., Any]]:
    """A factory of ``MooncakeFeatureStore``s of this test's namespace on the shared master; all closed after."""
    from featurestream import MooncakeFeatureStore

    made: list[MooncakeFeatureStore] = []

    def factory(**overrides: Any) -> MooncakeFeatureStore:
        kwargs = mooncake_master.store_kwargs(namespace=namespace, global_segment_size=64 << 20, close_timeout=0)
        store = MooncakeFeatureStore(**{**kwargs, **overrides})
        made.append(store)
        return store

    yield factory
    for store in made:
        store.close(force=True)
