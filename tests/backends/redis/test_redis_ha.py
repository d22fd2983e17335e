"""A replicated queue through Sentinel: the primary SIGKILLed during puts, acks, reclaims, dead-lettering and
ledger commits, a replica promoted, the old primary restarted as a replica; nothing a call reported done is
lost or done twice (``docs/redis.md``, "Replication and failover"). Real servers and sentinels throughout."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")

from featurestream import LocalFeatureStore, SharedDirFeatureStore  # noqa: E402
from featurestream import VisibilityTimeout as VT  # noqa: E402
from featurestream.backends.redis.link import (  # noqa: E402
    NotPrimary,
    NotReplicated,
    PrimaryLost,
    RedisUnreachable,
    ReplicasMissing,
    SentinelAtUrl,
)
from featurestream.backends.redis.queue import RedisSampleRefQueue, list_queues  # noqa: E402
from featurestream.backends.redis.replicas import TooFewReplicas  # noqa: E402
from featurestream.backends.redis.sentinel import SentinelServiceError  # noqa: E402
from featurestream.cli import main  # noqa: E402
from featurestream.testing import sample_tensors  # noqa: E402
from featurestream.testing.resume import ResumeProcesses, check_history, latest_checkpoint  # noqa: E402
from featurestream.tools.redis_servers import ReplicatedRedis  # noqa: E402
from featurestream.tools.servers import free_port  # noqa: E402

# Long enough for a failover (about 1-2 s here) and the old primary's restart as a replica.
RECONNECT = 30.0


@pytest.fixture
def make(cluster: ReplicatedRedis) -> Iterator[Callable[..., RedisSampleRefQueue]]:
    """Instances of one fresh queue through the cluster's sentinels (the cluster healthy again after the
    previous test's failover); all disconnected after."""
    cluster.wait_healthy()
    name = f"ha-{uuid.uuid4().hex}"
    made: list[RedisSampleRefQueue] = []

    def factory(store: Any, **kwargs: Any) -> RedisSampleRefQueue:
        queue = RedisSampleRefQueue(
            store,
            VT(kwargs.pop("vt", 30.0)),
            name=name,
            sentinels=cluster.sentinel_addresses,
            service_name=cluster.service,
            **{"reconnect_timeout": RECONNECT, **kwargs},
        )
        made.append(queue)
        return queue

    yield factory
    for queue in made:
        queue.disconnect()


def _failover(cluster: ReplicatedRedis, started: threading.Event) -> None:
    """Once ``started`` is set: SIGKILL the primary, wait for the promotion, restart the old one as a replica."""
    assert started.wait(60)
    old = cluster.kill_primary()
    cluster.wait_failover(old)
    cluster.restart(old)


def _during_failover(cluster: ReplicatedRedis, work: Callable[[threading.Event], None]) -> None:
    """Run ``work`` (which sets the event once it is under way) while the primary is lost and replaced."""
    started = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work(started)
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)
            started.set()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        _failover(cluster, started)
    finally:
        thread.join(120)
    assert not thread.is_alive(), "a call hung past its bound across the failover"
    if errors:
        raise errors[0]


def _refs(store: LocalFeatureStore, count: int, tag: str) -> list[Any]:
    return [store.put(f"{tag}-{index}", sample_tensors(index % 4)) for index in range(count)]


def _drain(queue: RedisSampleRefQueue, settle: Callable[[Any], None]) -> None:
    """Settle what is left, including a lease whose acquire's reply died with the primary (the retry on the
    promoted server leased anew; that lease is reclaimed after its visibility timeout and delivered again)."""
    give_up = time.monotonic() + 60
    while queue.pending_count() + queue.outstanding_count() > 0:
        assert time.monotonic() < give_up, "samples left leased or pending after the failover"
        lease = queue.acquire(timeout=0.5)
        if lease is not None:
            settle(lease)


def _assert_empty(queue: RedisSampleRefQueue, store: LocalFeatureStore) -> None:
    assert (queue.pending_count(), queue.outstanding_count()) == (0, 0)
    health = store.health()
    assert (health.sample_count, health.resident_bytes) == (0, 0)


def test_puts_and_acks_across_a_failover_lose_and_duplicate_nothing(cluster: ReplicatedRedis, make: Any) -> None:
    store = LocalFeatureStore()
    producer, consumer = make(store), make(store, vt=2.0)
    refs = _refs(store, 40, "pa")
    acked: list[str] = []

    def ack(lease: Any) -> None:
        # an ack held up by the failover past the lease's deadline is stale (the sample comes again)
        if consumer.ack(lease):
            acked.append(lease.ref.sample_id)

    def work(started: threading.Event) -> None:
        for index, ref in enumerate(refs):
            producer.put(ref)
            if index == 10:
                started.set()
            lease = consumer.acquire(timeout=0)
            if lease is not None:
                ack(lease)

    _during_failover(cluster, work)
    _drain(consumer, ack)
    # every put stands, and each sample was acked effectively once
    assert sorted(acked) == sorted(ref.sample_id for ref in refs)
    assert consumer.stats().acked == len(refs)
    _assert_empty(consumer, store)


def test_a_reclaim_across_a_failover_redelivers_once(cluster: ReplicatedRedis, make: Any) -> None:
    store = LocalFeatureStore()
    producer, consumer = make(store), make(store)
    slow = make(store, vt=0.5)
    refs = _refs(store, 8, "rc")
    producer.put_many(refs)
    held = [slow.acquire(timeout=0) for _ in refs]  # leased, never acked: reclaimed after the failover
    delivered: list[str] = []

    def work(started: threading.Event) -> None:
        started.set()
        while len(delivered) < len(refs):
            lease = consumer.acquire(timeout=1.0)
            if lease is not None:
                assert lease.redelivery_count == 1
                assert consumer.ack(lease)
                delivered.append(lease.ref.sample_id)

    _during_failover(cluster, work)
    assert sorted(delivered) == sorted(ref.sample_id for ref in refs)
    assert not any(slow.ack(lease) for lease in held if lease is not None)  # the reclaimed leases are stale
    _assert_empty(consumer, store)


def test_dead_lettering_across_a_failover_letters_each_sample_once(cluster: ReplicatedRedis, make: Any) -> None:
    store = LocalFeatureStore()
    letters: list[str] = []
    queue = make(store, vt=2.0, max_deliveries=2, on_dead_letter=lambda letter: letters.append(letter.ref.sample_id))
    refs = _refs(store, 20, "dl")
    queue.put_many(refs)

    def fail(lease: Any) -> None:
        queue.fail(lease)  # stale when the failover held it up past the lease's deadline: then reclaimed

    def work(started: threading.Event) -> None:
        failed = 0
        while (lease := queue.acquire(timeout=0)) is not None:
            fail(lease)
            failed += 1
            if failed == 5:
                started.set()

    _during_failover(cluster, work)
    _drain(queue, fail)
    ids = sorted(ref.sample_id for ref in refs)
    assert sorted(letters) == ids
    assert sorted(letter.ref.sample_id for letter in queue.dead_letters()) == ids
    assert queue.purge_dead_letters() and queue.dead_letters() == []
    _assert_empty(queue, store)


def test_ledger_commits_across_a_failover_train_each_key_once(cluster: ReplicatedRedis, make: Any) -> None:
    ledger = make(LocalFeatureStore()).training_ledger()
    keys = [str(index) for index in range(60)]
    ledger.declare(keys)
    claimed = ledger.claim(dict.fromkeys(keys, 0))
    assert claimed == dict.fromkeys(keys, 1)
    incarnation = ledger.restore(0, 0).incarnation

    def work(started: threading.Event) -> None:
        for step in range(1, 31):
            ledger.commit(0, incarnation, step, keys[2 * (step - 1) : 2 * step])
            if step == 5:
                started.set()

    _during_failover(cluster, work)
    history = ledger.history(0)
    assert history == {step: keys[2 * (step - 1) : 2 * step] for step in range(1, 31)}
    progress = ledger.progress()
    assert (progress.trained, progress.duplicates) == (60, 0)
    restored = ledger.restore(0, 20)  # rolls back steps 21..30, on the promoted server
    assert sorted(restored.rolled_back) == sorted(keys[40:])


def test_an_operators_handle_and_listing_go_through_sentinel(cluster: ReplicatedRedis, make: Any) -> None:
    queue = make(LocalFeatureStore())
    handle = RedisSampleRefQueue.open(
        None, queue.name, sentinels=cluster.sentinel_addresses, service_name=cluster.service
    )
    try:
        assert handle.pending_count() == 0
    finally:
        handle.disconnect()
    listed = list_queues(None, sentinels=cluster.sentinel_addresses, service_name=cluster.service)
    assert listed[queue.name] == "open"


def test_bad_sentinel_input_is_refused_naming_what_is_wrong(cluster: ReplicatedRedis) -> None:
    cluster.wait_healthy()
    sentinels = cluster.sentinel_addresses
    named = ", ".join(f"{host}:{port}" for host, port in sentinels)
    with pytest.raises(SentinelServiceError, match=r"no sentinel monitors service 'nope'") as caught:
        RedisSampleRefQueue(LocalFeatureStore(), sentinels=sentinels, service_name="nope", name="x")
    assert named in str(caught.value)
    dead = [("127.0.0.1", free_port()), ("127.0.0.1", free_port())]
    with pytest.raises(SentinelServiceError, match=r"none of the 2 sentinels answers"):
        RedisSampleRefQueue(
            LocalFeatureStore(), sentinels=dead, service_name=cluster.service, name="x", reconnect_timeout=0.5
        )
    with pytest.raises(ReplicasMissing, match=r"min_replicas=3 but .* has [01] replica\(s\) connected"):
        RedisSampleRefQueue(
            LocalFeatureStore(),
            sentinels=sentinels,
            service_name=cluster.service,
            name="x",
            min_replicas=3,
            reconnect_timeout=0.5,
        )
    with pytest.raises(TypeError, match=r"each sentinel must be a \(host, port\) pair, got 'localhost'"):
        RedisSampleRefQueue(LocalFeatureStore(), sentinels=["localhost"], service_name="s", name="x")
    with pytest.raises(ValueError, match=r"port must be an int in 1..65535, got 0"):
        RedisSampleRefQueue(LocalFeatureStore(), sentinels=[("h", 0)], service_name="s", name="x")
    with pytest.raises(ValueError, match=r"min_replicas must be >= 0, got -1"):
        RedisSampleRefQueue(LocalFeatureStore(), sentinels=sentinels, service_name="s", name="x", min_replicas=-1)
    with pytest.raises(ValueError, match=r"either a url or sentinels"):
        RedisSampleRefQueue(LocalFeatureStore(), url="redis://h:1/0", sentinels=sentinels, service_name="s")


def test_unanswering_sentinels_and_a_sentinels_url_are_refused_within_seconds(cluster: ReplicatedRedis) -> None:
    dead = [("127.0.0.1", free_port()) for _ in range(3)]
    started = time.monotonic()
    with pytest.raises(SentinelServiceError, match=r"none of the 3 sentinels answers \(tried for 3 s\)"):
        RedisSampleRefQueue(LocalFeatureStore(), sentinels=dead, service_name=cluster.service, name="x")
    assert time.monotonic() - started < 3.0 + 2.0, "a first contact is bounded by 3 s, not reconnect_timeout"
    hung = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]  # accept connections, never answer
    try:
        started = time.monotonic()
        with pytest.raises(SentinelServiceError, match=r"none of the 3 sentinels answers"):
            RedisSampleRefQueue(
                LocalFeatureStore(),
                sentinels=[("127.0.0.1", sock.getsockname()[1]) for sock in hung],
                service_name=cluster.service,
                name="x",
            )
        assert time.monotonic() - started < 3.0 + 2.0 + 2.0, "3 s, and at most one more try of 2 s, not 2 s each"
    finally:
        for sock in hung:
            sock.close()
    url = f"redis://127.0.0.1:{cluster.sentinels[0].port}/0"
    with pytest.raises(SentinelAtUrl, match=rf":{cluster.sentinels[0].port}/0 is a Sentinel, not a Redis server"):
        RedisSampleRefQueue(LocalFeatureStore(), url=url, name=f"ha-{uuid.uuid4().hex}")
    with pytest.raises(SentinelAtUrl, match=r"monitors service\(s\) 'featurestream'\): pass sentinels="):
        RedisSampleRefQueue(LocalFeatureStore(), url=url, name=f"ha-{uuid.uuid4().hex}")


def test_a_replica_given_as_the_primary_is_refused(cluster: ReplicatedRedis) -> None:
    cluster.wait_healthy()
    primary = cluster.primary()
    replica = next(server for server in cluster.servers if server is not primary and server.process is not None)
    url = f"redis://127.0.0.1:{replica.port}/0"
    with pytest.raises(NotPrimary, match=rf"127.0.0.1:{replica.port}/0 is a read-only replica, not the primary"):
        RedisSampleRefQueue(LocalFeatureStore(), url=url, name=f"ha-{uuid.uuid4().hex}")


def test_a_service_whose_primary_is_down_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Passwords on the servers and the sentinels work (the CLI's from the environment) and are never printed.
    No replica to promote: a queue already connected gives up after reconnect_timeout with PrimaryLost naming
    the service and sentinels; once the sentinels flag the primary down, connecting says so."""
    secrets = {"password": "s3cret-server", "sentinel_password": "s3cret-sentinel"}
    with ReplicatedRedis(tmp_path, replicas=0, **secrets) as lonely:
        connection = {"sentinels": lonely.sentinel_addresses, "service_name": lonely.service, **secrets}
        store = LocalFeatureStore()
        queue = RedisSampleRefQueue(store, name="lonely", reconnect_timeout=1.0, min_replicas=0, **connection)
        first, second = _refs(store, 2, "lonely")
        queue.put(first)
        with pytest.raises(RedisUnreachable, match=r"Sentinel service 'featurestream'") as refused:
            RedisSampleRefQueue(store, name="lonely", reconnect_timeout=1.0, **{**connection, "password": "wr0ng"})
        assert "wr0ng" not in str(refused.value) and "s3cret" not in str(refused.value)
        monkeypatch.setenv("FEATURESTREAM_REDIS_PASSWORD", secrets["password"])
        monkeypatch.setenv("FEATURESTREAM_SENTINEL_PASSWORD", secrets["sentinel_password"])
        target = [arg for host, port in lonely.sentinel_addresses for arg in ("--sentinel", f"{host}:{port}")]
        assert main(["status", *target, "--service", lonely.service, "--name", "lonely", "--json"]) == 0
        out = capsys.readouterr().out
        assert json.loads(out)["pending"] == 1 and "s3cret" not in out
        lonely.kill_primary()
        with pytest.raises(PrimaryLost, match=r"Sentinel service 'featurestream' \(sentinels 127.0.0.1:"):
            queue.put(second)
        queue.disconnect()
        with pytest.raises(SentinelServiceError, match=r"report its primary 127.0.0.1:\d+ down") as caught:
            _wait_reported_down(
                lambda: RedisSampleRefQueue(store, name="lonely", min_replicas=0, reconnect_timeout=1.0, **connection)
            )
        assert "s3cret" not in str(caught.value)


def _wait_reported_down(connect: Callable[[], object]) -> None:
    """``connect`` until it raises other than for a primary the sentinels still call up (before
    down-after-milliseconds passes, a connection is refused instead)."""
    give_up = time.monotonic() + 10
    while True:
        try:
            connect()
        except SentinelServiceError:
            raise
        except redis.ConnectionError:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.1)


def test_an_effect_no_replica_has_is_never_reported_done(cluster: ReplicatedRedis, make: Any) -> None:
    """The replica stopped (SIGSTOP): a put reaches the primary only, so it does not return; it raises
    NotReplicated once reconnect_timeout is spent, as a lost reply would. Resumed, the next put returns."""
    store = LocalFeatureStore()
    queue = make(store, reconnect_timeout=1.5)
    primary = cluster.primary()
    replica = next(server for server in cluster.servers if server is not primary and server.process is not None)
    assert replica.process is not None
    first, second = _refs(store, 2, "stop")
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        with pytest.raises(NotReplicated, match=r"reached 0 of min_replicas=1 replica\(s\)"):
            queue.put(first)
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    queue.put(second)  # returns: the replica has it (and the first put, which the primary applied)
    assert queue.pending_count() == 2


def test_without_replicas_a_call_sends_no_wait(cluster: ReplicatedRedis, make: Any) -> None:
    """min_replicas=0 (the default at a URL): no WAIT, the hot path as before; min_replicas=1: one per call."""
    primary = cluster.primary()
    client = primary.client()
    store = LocalFeatureStore()
    plain = RedisSampleRefQueue(store, url=f"redis://127.0.0.1:{primary.port}/0", name=f"ha-{uuid.uuid4().hex}")
    replicated = make(store)
    try:
        for queue, tag in ((plain, "plain"), (replicated, "replicated")):
            client.config_resetstat()
            for ref in _refs(store, 3, tag):
                queue.put(ref)
            waits = client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0)
            assert waits == (0 if queue is plain else 3)
    finally:
        plain.disconnect()
        client.close()


def test_the_cli_reaches_a_queue_through_sentinel(
    cluster: ReplicatedRedis, make: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FEATURESTREAM_REDIS_URL", raising=False)
    store = LocalFeatureStore()
    queue = make(store)
    queue.put_many(_refs(store, 3, "cli"))
    target = [arg for host, port in cluster.sentinel_addresses for arg in ("--sentinel", f"{host}:{port}")]
    assert main(["status", *target, "--service", cluster.service, "--name", queue.name, "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["pending"] == 3 and status["url"].startswith(f"Sentinel service {cluster.service!r} (sentinels")
    assert main(["dead-letters", "list", *target, "--service", cluster.service, "--name", queue.name]) == 0
    assert "0 dead letters in queue" in capsys.readouterr().out
    assert main(["status", *target, "--name", queue.name]) == 2
    assert "--sentinel needs --service NAME" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["status", "--sentinel", "nowhere", "--service", "s"])
    assert "must be HOST:PORT with a port in 1..65535, got 'nowhere'" in capsys.readouterr().err


def test_a_primary_refusing_writes_for_want_of_replicas_is_retried(cluster: ReplicatedRedis, make: Any) -> None:
    """min-replicas-to-write above the replicas: the primary answers NOREPLICAS (nothing ran), which the queue
    retries as a connection error until reconnect_timeout, then names (TooFewReplicas: the service, the replicas
    it has and needs); lowered again, it works."""
    store = LocalFeatureStore()
    queue = make(store, reconnect_timeout=1.0)
    first, second = _refs(store, 2, "noreplicas")
    admin = cluster.primary().client()
    admin.config_set("min-replicas-to-write", 2)
    try:
        with pytest.raises(
            TooFewReplicas, match=r"it has 1 replica\(s\) connected and its min-replicas-to-write needs 2"
        ):
            queue.put(first)
    finally:
        admin.config_set("min-replicas-to-write", 0)
        admin.close()
    queue.put(second)
    assert queue.pending_count() == 1  # the refused put never ran


def test_a_retried_restore_reports_the_keys_its_first_run_rolled_back(make: Any) -> None:
    ledger = make(LocalFeatureStore()).training_ledger()
    ledger.declare(["a", "b"])
    ledger.claim({"a": 0, "b": 0})
    incarnation = ledger.restore(0, 0).incarnation
    ledger.commit(0, incarnation, 1, ["a"])
    ledger.commit(0, incarnation, 2, ["b"])
    keys = [ledger._ranks, ledger._steps(0), ledger._trained, ledger._counts, ledger._restores]
    first = ledger._change(ledger._restore, keys, [0, 1, "same-token"])
    again = ledger._change(ledger._restore, keys, [0, 1, "same-token"])  # the retry after a lost reply
    assert first == again and [key.decode() for key in first[1]] == ["b"]
    assert ledger.progress().restores == 2  # the one before the commits, and this one once


def test_sigkilled_primary_host_and_trainer_train_every_prompt_once(cluster: ReplicatedRedis, tmp_path: Path) -> None:
    """tests/backends/redis/test_redis_resume.py's SIGKILL run with the Redis host lost instead of one server restarted:
    a trainer and a producer process through Sentinel; the trainer SIGKILLed twice (restored from its latest
    checkpoint) and the primary twice (each time a replica promoted and the old primary restarted as a replica)."""
    cluster.wait_healthy()
    n = 40
    shared, checkpoints = tmp_path / "shared", tmp_path / "checkpoints"
    checkpoints.mkdir()
    SharedDirFeatureStore(shared, max_samples=None, max_bytes=1 << 30)
    sentinels = ",".join(f"{host}:{port}" for host, port in cluster.sentinel_addresses)
    common = ["--sentinel", sentinels, "--service", cluster.service, "--name", f"ha-resume-{uuid.uuid4().hex}"]
    common += ["--store-dir", str(shared), "--prompts", str(n), "--visibility", "3.0"]
    victims = ["trainer", "primary", "trainer", "primary"]
    give_up = time.monotonic() + 240
    with ResumeProcesses(common, checkpoints, tmp_path, step_seconds=0.1) as run:
        while not run.trained():
            assert time.monotonic() < give_up, f"no end by the deadline; victims left {victims}"
            time.sleep(1.0)
            if not victims or run.trained():
                continue
            victim = victims.pop(0)
            if victim == "primary":
                old = cluster.kill_primary()
                cluster.wait_failover(old)
                cluster.restart(old)
            else:
                run.restart("trainer")
        run.finish()
    assert not victims, f"the run ended before every kill: {victims} left"
    final = latest_checkpoint(checkpoints)
    assert final is not None
    assert check_history(final["history"], n) is None, check_history(final["history"], n)
