"""``Started``: a ``with`` block starts what it opens and stops it on the way out, also when the block raises."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

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


def _kernel_picks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *ports: int) -> None:
    """The probe socket gets ``ports`` in turn from the kernel; this process and the machine handed out none."""
    picks = iter(ports)

    class Probe(socket.socket):
        def getsockname(self) -> tuple[str, int]:
            return (servers.HOST, next(picks))

    monkeypatch.setattr(servers, "_HANDED_OUT", set())
    monkeypatch.setattr(servers, "_REGISTRY", tmp_path / "ports")
    monkeypatch.setattr(servers.socket, "socket", Probe)


def test_free_port_never_hands_out_a_port_twice(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The kernel may pick a closed probe's port again at once: here it picks 40001 twice before 40002.
    _kernel_picks(monkeypatch, tmp_path, 40001, 40001, 40002)
    assert [servers.free_port(), servers.free_port()] == [40001, 40002]


def test_free_port_skips_a_port_another_process_was_handed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Another pytest-xdist worker was handed 40001 a second ago (its server may not have bound it yet) and 40003
    # eleven minutes ago; a torn line is ignored.
    _kernel_picks(monkeypatch, tmp_path, 40001, 40002, 40003)
    now = time.time()
    (tmp_path / "ports").write_text(f"40001 {now - 1}\n40003 {now - 660}\n4000")
    assert [servers.free_port(), servers.free_port()] == [40002, 40003]
    reserved = {int(line.split()[0]) for line in (tmp_path / "ports").read_text().splitlines()}
    assert reserved == {40001, 40002, 40003}


def test_free_port_registry_is_shared_by_processes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(servers, "_REGISTRY", tmp_path / "ports")
    mine = {servers.free_port() for _ in range(20)}
    code = (
        "import sys, pathlib; from featurestream.tools import servers; servers._REGISTRY = pathlib.Path(sys.argv[1]);"
        "print(*[servers.free_port() for _ in range(20)])"
    )
    child = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "ports")], capture_output=True, text=True, check=True
    )
    theirs = {int(port) for port in child.stdout.split()}
    assert len(mine) == len(theirs) == 20
    assert not mine & theirs
    assert len((tmp_path / "ports").read_text().splitlines()) == 40
