"""``featurestream serve redis|sentinel|mooncake``, as docs/redis.md and docs/data-plane.md tell a user to run
them: each starts its servers, prints how to connect, is connected to by a queue or a store, and stops them all
on SIGTERM."""

from __future__ import annotations

import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from featurestream import LocalFeatureStore
from featurestream import VisibilityTimeout as VT
from featurestream.testing import sample_tensors
from featurestream.tools.mooncake import missing_reason
from featurestream.tools.servers import listening


class Served:
    """A ``featurestream serve`` process: its first line of output (how to connect) and the rest."""

    def __init__(self, *argv: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "featurestream", "serve", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.connect = self._lines.get(timeout=60)
        except queue.Empty:
            self.process.kill()
            raise AssertionError("featurestream serve printed nothing within 60 s") from None

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))

    def stop(self) -> int:
        """SIGTERM, as a user's Ctrl-C or a supervisor would; its exit status."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[type[Served]]:
    started: list[Served] = []

    def start(*argv: str) -> Served:
        served = Served(*argv, "--dir", str(tmp_path / uuid.uuid4().hex))
        started.append(served)
        return served

    yield start  # type: ignore[misc]
    for served in started:
        if served.process.poll() is None:
            served.process.kill()
            served.process.wait(timeout=60)


def _ports(line: str) -> list[int]:
    return [int(port) for port in re.findall(r"127\.0\.0\.1:(\d+)", line)]


def _require_redis() -> None:
    pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH (Debian/Ubuntu: apt-get install redis-server)")


def test_serve_redis_runs_a_durable_server_a_queue_connects_to(serve: type[Served], tmp_path: Path) -> None:
    _require_redis()
    from featurestream.backends.redis.queue import RedisSampleRefQueue

    served = serve("redis", "--port", "0")
    found = re.fullmatch(r"url=(redis://127\.0\.0\.1:\d+/0)", served.connect)
    assert found is not None, served.connect
    store = LocalFeatureStore()
    queue_ = RedisSampleRefQueue(store, VT(10.0), url=found.group(1), name=f"serve-{uuid.uuid4().hex}")
    queue_.put(store.put("s0", sample_tensors(0)))
    assert queue_.pending_count() == 1
    config = queue_._redis.config_get("appendonly", "appendfsync")
    assert config == {b"appendonly": b"yes", b"appendfsync": b"always"} or config == {
        "appendonly": "yes",
        "appendfsync": "always",
    }
    queue_.disconnect()
    assert served.stop() == 0
    assert not any(listening(port) for port in _ports(served.connect)), "the server outlived the command"


def test_serve_sentinel_runs_a_cluster_that_survives_its_primary(serve: type[Served]) -> None:
    _require_redis()
    from featurestream.backends.redis.queue import RedisSampleRefQueue

    served = serve("sentinel")
    sentinels = [("127.0.0.1", int(port)) for port in re.findall(r"--sentinel 127\.0\.0\.1:(\d+)", served.connect)]
    assert len(sentinels) == 3 and "--service featurestream" in served.connect, served.connect
    store = LocalFeatureStore()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # two replicas: a spare one, no warning
        queue_ = RedisSampleRefQueue(
            store, VT(10.0), sentinels=sentinels, service_name="featurestream", name=f"serve-{uuid.uuid4().hex}"
        )
    queue_.put(store.put("s0", sample_tensors(0)))
    lease = queue_.acquire(timeout=5.0)
    assert lease is not None and queue_.ack(lease)
    queue_.disconnect()
    assert served.stop() == 0
    assert not any(listening(port) for _, port in sentinels), "a sentinel outlived the command"


def test_serve_mooncake_runs_a_master_a_store_connects_to(serve: type[Served], monkeypatch: pytest.MonkeyPatch) -> None:
    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    from featurestream import MooncakeFeatureStore

    served = serve("mooncake", "--port", "0", "--metadata-port", "0")
    kwargs = dict(re.findall(r"(\w+)='([^']*)'", served.connect))
    assert set(kwargs) == {"master_server_address", "metadata_server", "local_hostname", "protocol"}, served.connect
    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")  # what the printed line says to export
    assert "MC_TCP_BIND_ADDRESS=127.0.0.1" in served.connect
    store = MooncakeFeatureStore(**kwargs, global_segment_size=16 << 20, local_buffer_size=16 << 20, close_timeout=0)
    ref = store.put("s0", sample_tensors(0))
    tensors, handle = store.get(ref)
    assert set(tensors) == set(sample_tensors(0))
    store.release(handle)
    store.close(force=True)
    assert served.stop() == 0
    assert not any(listening(port) for port in _ports(served.connect)), "the master outlived the command"
