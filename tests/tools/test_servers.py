"""``Started``: a ``with`` block starts what it opens and stops it on the way out, also when the block raises."""

from __future__ import annotations

import socket

import pytest

from featurestream.tools import servers
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
    from featurestream.tools.redis_servers import ReplicatedRedis

    assert issubclass(ServerProcess, Started) and issubclass(ReplicatedRedis, Started)


def test_free_port_never_hands_out_a_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel may pick a closed probe's port again at once: here it picks 40001 twice before 40002.
    picks = iter([40001, 40001, 40002])

    class Probe(socket.socket):
        def getsockname(self) -> tuple[str, int]:
            return (servers.HOST, next(picks))

    monkeypatch.setattr(servers, "_HANDED_OUT", set())
    monkeypatch.setattr(servers.socket, "socket", Probe)
    assert [servers.free_port(), servers.free_port()] == [40001, 40002]
