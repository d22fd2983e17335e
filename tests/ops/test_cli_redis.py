"""``featurestream status`` and ``featurestream dead-letters`` against a real redis-server, as an operator runs them."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from featurestream import LocalFeatureStore, VisibilityTimeout
from featurestream.cli import main
from featurestream.monitor.status import COUNTERS, GAUGES
from featurestream.testing import sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(redis_server: Any, queue_name: str, capsys: pytest.CaptureFixture[str]) -> Run:
    """Run ``featurestream COMMAND... --redis URL --name NAME ARGS...``; return (exit status, stdout, stderr)."""

    def run(*command: str, args: tuple[str, ...] = (), url: str | None = None, name: str | None = None) -> Any:
        capsys.readouterr()
        target = ["--redis", url or redis_server.url, "--name", name or queue_name]
        status = main([*command, *target, *args])
        out, err = capsys.readouterr()
        return status, out, err

    return run


@pytest.fixture
def producer(redis_server: Any, queue_name: str) -> Iterator[Callable[..., RedisSampleRefQueue]]:
    """The trainer's side of the queue: an instance with a store, on the server's clock like the operator's."""
    made: list[RedisSampleRefQueue] = []

    def make(**kwargs: Any) -> RedisSampleRefQueue:
        store = LocalFeatureStore(max_samples=None, max_bytes=1 << 30)
        queue = RedisSampleRefQueue(store, VisibilityTimeout(30.0), url=redis_server.url, name=queue_name, **kwargs)
        made.append(queue)
        return queue

    yield make
    for queue in made:
        queue.disconnect()


def put(queue: RedisSampleRefQueue, *ids: str) -> None:
    for index, sample_id in enumerate(ids):
        queue.put(queue.store.put(sample_id, sample_tensors(index), run_id="run"))


def kill(queue: RedisSampleRefQueue, sample_id: str) -> None:
    """Lease the head, which must be ``sample_id``, and fail it into the dead letters (max_deliveries=1)."""
    lease = queue.acquire(timeout=0)
    assert lease is not None and lease.ref.sample_id == sample_id
    queue.fail(lease)


def traffic(queue: RedisSampleRefQueue) -> None:
    """With max_deliveries=1: 5 put, "a" acked, "b" dead, "c" leased, "d" and "e" pending."""
    put(queue, "a", "b", "c", "d", "e")
    first = queue.acquire(timeout=0)
    assert first is not None
    queue.ack(first)
    kill(queue, "b")
    assert queue.acquire(timeout=0) is not None


def rows(table: str) -> dict[str, list[str]]:
    """The status table's rows: label (the first 22 columns after the indent) -> the words after it."""
    return {line[2:24].strip(): line[24:].split() for line in table.splitlines()[2:] if not line.startswith("    ")}


# -- status ---------------------------------------------------------------------
def test_status_table_during_traffic(cli: Run, producer: Callable[..., RedisSampleRefQueue], queue_name: str) -> None:
    traffic(producer(max_deliveries=1))
    status, out, err = cli("status")
    assert status == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].startswith(f"queue {queue_name!r} at redis://127.0.0.1:") and lines[0].endswith(": open")
    row = rows(out)
    assert row["pending"] == ["2"]
    assert row["leased"][0] == "1" and "oldest lease" in " ".join(row["leased"])
    assert row["acked"] == ["1"] and row["failed"] == ["1"] and row["leased (total)"] == ["3"]
    assert row["dead lettered"] == ["1"] and row["dead letters"] == ["1"]
    assert row["backpressure"][:2] == ["-", "(each"]
    assert any(line.startswith("    b  (1 delivery)  ") for line in lines)


def test_status_json_has_the_snapshot_keys(
    cli: Run, producer: Callable[..., RedisSampleRefQueue], queue_name: str
) -> None:
    traffic(producer(max_deliveries=1))
    status, out, _ = cli("status", args=("--json",))
    assert status == 0
    snapshot = json.loads(out)
    assert snapshot["name"] == queue_name and snapshot["url"].startswith("redis://127.0.0.1:")
    assert snapshot["lifecycle"] == "open" and snapshot["schema"] == 1
    assert (snapshot["pending"], snapshot["leased"]) == (2, 1)
    assert set(GAUGES) <= set(snapshot)
    assert snapshot["oldest_lease_age_s"] >= 0
    assert set(snapshot["counters"]) == set(COUNTERS)
    assert {k: snapshot["counters"][k] for k in ("put", "leased", "acked", "failed", "dead_lettered")} == {
        "put": 5, "leased": 3, "acked": 1, "failed": 1, "dead_lettered": 1
    }  # fmt: skip
    assert snapshot["rates"] is None and snapshot["backpressure"] is None
    assert snapshot["dead_letters"]["count"] == 1
    assert [d["sample_id"] for d in snapshot["dead_letters"]["newest"]] == ["b"]


def test_status_reads_only_the_newest_dead_letters(
    cli: Run, producer: Callable[..., RedisSampleRefQueue], redis_server: Any, queue_name: str
) -> None:
    queue = producer(max_deliveries=1)
    put(queue, "a", "b", "c")
    for sample_id in ("a", "b", "c"):
        kill(queue, sample_id)
    # An old letter that would not decode: status lists the newest two without reading it.
    with redis.Redis.from_url(redis_server.url) as client:
        client.lset(f"featurestream:{{{queue_name}}}:dead", 0, b"not a dead letter")
    status, out, _ = cli("status", args=("--json", "--dead-letters", "2"))
    assert status == 0
    dead = json.loads(out)["dead_letters"]
    assert dead["count"] == 3 and [d["sample_id"] for d in dead["newest"]] == ["c", "b"]


def test_status_watch_refreshes_with_rates(cli: Run, producer: Callable[..., RedisSampleRefQueue]) -> None:
    put(producer(), "a")
    status, out, _ = cli("status", args=("--json", "--watch", "0.01", "--count", "3"))
    assert status == 0
    snapshots = [json.loads(line) for line in out.splitlines()]
    assert len(snapshots) == 3
    assert snapshots[0]["rates"] is None
    assert all(set(s["rates"]) == set(COUNTERS) and s["interval_s"] > 0 for s in snapshots[1:])
    assert all(s["pending"] == 1 for s in snapshots)


def test_status_watch_table_prints_rates(cli: Run, producer: Callable[..., RedisSampleRefQueue]) -> None:
    put(producer(), "a")
    status, out, _ = cli("status", args=("--watch", "0.01", "--count", "2"))
    assert status == 0
    tables = out.split("\n\n")
    assert len(tables) == 2
    assert rows(tables[0])["put"] == ["1"]  # no rates on the first refresh
    assert rows(tables[1])["put"] == ["1", "0.0"]


def test_status_watch_stops_quietly_when_its_reader_goes_away(
    redis_server: Any, queue_name: str, producer: Callable[..., RedisSampleRefQueue]
) -> None:
    put(producer(), "a")
    command = [sys.executable, "-m", "featurestream", "status", "--redis", redis_server.url, "--name", queue_name]
    watch = subprocess.Popen([*command, "--json", "--watch", "0.05"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert watch.stdout is not None and watch.stderr is not None
    assert json.loads(watch.stdout.readline())["pending"] == 1
    watch.stdout.close()  # like `| head -1`
    assert watch.wait(timeout=60) == 0
    assert watch.stderr.read() == b""  # no BrokenPipeError traceback


def test_status_of_a_missing_queue_exits_2_naming_it(cli: Run, redis_server: Any) -> None:
    status, out, err = cli("status", name="no-such-queue")
    assert status == 2 and out == ""
    assert "'no-such-queue'" in err and redis_server.url in err
    assert not redis.Redis.from_url(redis_server.url).keys("*no-such-queue*")  # looking did not create it


def test_status_of_an_unreachable_server_exits_2_naming_it(cli: Run) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{sock.getsockname()[1]}/0"  # bound, not listening: connections are refused
        status, out, err = cli("status", url=url, name="q")
    assert status == 2 and out == ""
    assert url in err and "'q'" in err


def test_status_of_a_server_that_is_not_redis_exits_2_saying_so(
    cli: Run, not_redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, err = cli("status", url=not_redis_url, name="q")
    assert status == 2 and out == ""
    assert f"Redis at {not_redis_url} for queue 'q': the server there is not a Redis server" in err
    assert main(["status", "--redis", not_redis_url]) == 2  # listing the queues: the same
    assert "is not a Redis server" in capsys.readouterr().err


def test_status_without_a_name_lists_the_queues(
    redis_server: Any, producer: Callable[..., RedisSampleRefQueue], queue_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    closed_name = f"{queue_name}-closed"
    producer()
    other = RedisSampleRefQueue(LocalFeatureStore(), url=redis_server.url, name=closed_name)
    other.close()
    other.disconnect()
    capsys.readouterr()
    assert main(["status", "--redis", redis_server.url]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith(f"featurestream queues at {redis_server.url}:")
    listed = dict(line.split() for line in out.splitlines()[1:])
    assert listed[queue_name] == "open" and listed[closed_name] == "drained"
    assert main(["status", "--redis", redis_server.url, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["url"] == redis_server.url
    assert {"name": queue_name, "lifecycle": "open"} in document["queues"]
    assert main(["status", "--redis", redis_server.url, "--watch", "1"]) == 2
    assert "--watch needs --name" in capsys.readouterr().err


def test_status_hides_the_password(cli: Run, redis_server: Any) -> None:
    url = redis_server.url.replace("redis://", "redis://:hunter2@")
    _, _, err = cli("status", url=url, name="no-such-queue")
    assert "hunter2" not in err and ":***@127.0.0.1" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--count", "2"), "--count needs --watch"),
        (("--watch", "1", "--count", "0"), "--count must be >= 1, got 0"),
        (("--dead-letters", "-1"), "--dead-letters must be >= 0, got -1"),
    ],
)
def test_status_usage_errors_exit_2(cli: Run, args: tuple[str, ...], message: str) -> None:
    status, _, err = cli("status", args=args)
    assert status == 2 and message in err


# -- dead letters -----------------------------------------------------------------
def test_dead_letters_list_requeue_ack_and_purge(cli: Run, producer: Callable[..., RedisSampleRefQueue]) -> None:
    queue = producer(max_deliveries=1, keep_dead_letter_bytes=1 << 30)
    put(queue, "a", "b")
    kill(queue, "a")
    kill(queue, "b")
    status, out, _ = cli("dead-letters", "list", args=("--json",))
    assert status == 0
    assert [(d["sample_id"], d["deliveries"]) for d in json.loads(out)["dead_letters"]] == [("a", 1), ("b", 1)]
    status, out, _ = cli("dead-letters", "list")
    lines = out.splitlines()
    assert status == 0 and lines[0].startswith("2 dead letters in queue")
    assert [line.split()[:2] for line in lines[2:]] == [["a", "1"], ["b", "1"]]

    status, out, _ = cli("dead-letters", "requeue", args=("a",))
    assert status == 0 and out.strip() == "requeued 1 dead letter: a"
    _, out, _ = cli("status", args=("--json",))
    counts = json.loads(out)
    assert (counts["pending"], counts["dead_letters"]["count"], counts["counters"]["requeued"]) == (1, 1, 1)
    lease = queue.acquire(timeout=0)
    assert lease is not None and lease.ref.sample_id == "a" and lease.redelivery_count == 0  # a fresh budget
    assert queue.store.get(lease.ref) is not None  # the kept bytes are there
    queue.ack(lease)
    assert queue.stats().acked == 1

    status, out, _ = cli("dead-letters", "purge", args=("--all", "--json"))
    assert status == 0 and json.loads(out)["purged"] == ["b"]
    status, out, _ = cli("dead-letters", "list", args=("--json",))
    assert json.loads(out)["dead_letters"] == []
    _, out, _ = cli("status", args=("--json",))
    assert json.loads(out)["dead_letters"] == {"count": 0, "newest": []}


def test_requeue_without_kept_bytes_is_refused_naming_the_id(
    cli: Run, producer: Callable[..., RedisSampleRefQueue]
) -> None:
    queue = producer(max_deliveries=1)  # dead letters' bytes leave the store
    put(queue, "gone")
    kill(queue, "gone")
    status, out, err = cli("dead-letters", "requeue", args=("gone",))
    assert status == 1 and out == ""
    assert "refused" in err and "'gone'" in err and "nothing requeued" in err
    _, out, _ = cli("dead-letters", "list", args=("--json",))
    assert [d["sample_id"] for d in json.loads(out)["dead_letters"]] == ["gone"]  # still dead, still listed


@pytest.mark.parametrize("action", ["requeue", "purge"])
def test_repair_refuses_to_act_on_nothing(cli: Run, producer: Callable[..., RedisSampleRefQueue], action: str) -> None:
    queue = producer(max_deliveries=1)
    put(queue, "x")
    kill(queue, "x")
    status, out, err = cli("dead-letters", action)
    assert status == 2 and out == ""
    assert f"name the sample ids to {action}, or pass --all" in err
    status, _, err = cli("dead-letters", action, args=("x", "--all"))
    assert status == 2 and "either sample ids or --all" in err
    assert [d.ref.sample_id for d in queue.dead_letters()] == ["x"]  # untouched


def test_dead_letters_of_a_missing_queue_exits_2(cli: Run) -> None:
    status, _, err = cli("dead-letters", "list", name="no-such-queue")
    assert status == 2 and "'no-such-queue'" in err
