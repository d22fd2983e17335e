"""``Started``: a ``with`` block starts what it opens and stops it on the way out, also when the block raises."""

from __future__ import annotations

import pytest

from featurestream.tools.servers import ServerProcess, Started


class Recorder(Started):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")


def test_a_with_block_starts_returns_itself_and_stops() -> None:
    recorder = Recorder()
    with recorder as entered:
        assert entered is recorder and recorder.calls == ["start"]
    assert recorder.calls == ["start", "stop"]


def test_a_block_that_raises_still_stops_and_the_error_propagates() -> None:
    recorder = Recorder()
    with pytest.raises(KeyError, match="boom"), recorder:
        raise KeyError("boom")
    assert recorder.calls == ["start", "stop"]


def test_server_processes_and_the_replicated_cluster_are_started_things() -> None:
    from featurestream.testing.sentinel import ReplicatedRedis

    assert issubclass(ServerProcess, Started) and issubclass(ReplicatedRedis, Started)
