"""The one-by-one hot path's shortcuts keep the guarantees: the settle feed skips only self-settled samples, and
the link's own connection survives kills, concurrency and other client shapes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from featurestream import LocalFeatureStore, SharedDirFeatureStore
from featurestream import VisibilityTimeout as VT
from featurestream.testing import sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py

Factory = Callable[..., RedisSampleRefQueue]


@pytest.fixture
def store() -> LocalFeatureStore:
    return LocalFeatureStore()


@pytest.fixture
def make(redis_server: Any, queue_name: str) -> Iterator[Factory]:
    """Instances of one queue (same name), each with its own client unless given one."""
    made: list[RedisSampleRefQueue] = []

    def factory(store: LocalFeatureStore, **kwargs: Any) -> RedisSampleRefQueue:
        kwargs.setdefault("visibility_timeout", VT(30.0))
        if "client" not in kwargs:
            kwargs["url"] = redis_server.url
        queue = RedisSampleRefQueue(store, name=queue_name, **kwargs)
        made.append(queue)
        return queue

    yield factory
    for queue in made:
        queue.disconnect()


def put(store: LocalFeatureStore, queue: RedisSampleRefQueue, name: str) -> Any:
    ref = store.put(name, sample_tensors(0))
    queue.put(ref)
    return ref


def retired_count(client: Any, queue_name: str) -> int:
    """How many ids the settle feed carries (one entry per settling call, one field pair per id)."""
    entries = client.xrange(f"featurestream:{{{queue_name}}}:retired")
    return sum(len(fields) for _, fields in entries)


def test_samples_settled_by_their_producer_stay_off_the_feed_others_go_on_it(
    make: Factory, redis_client: Any, queue_name: str, tmp_path: Path
) -> None:
    # two processes' instances of one shared store: the same URI, each its own residency
    producer_store, consumer_store = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
    producer = make(producer_store, max_deliveries=1)
    for name in ("own-ack", "own-dead", "elsewhere"):
        put(producer_store, producer, name)
    producer.ack(producer.acquire(timeout=0))  # type: ignore[arg-type]
    producer.fail(producer.acquire(timeout=0))  # type: ignore[arg-type]  # max_deliveries=1: dead
    assert retired_count(redis_client, queue_name) == 0, "a self-settled sample was fed"
    assert producer_store.health().sample_count == 1  # the producer scrubbed both itself
    consumer = make(consumer_store, max_deliveries=1)
    consumer.ack(consumer.acquire(timeout=0))  # type: ignore[arg-type]
    assert retired_count(redis_client, queue_name) == 1
    producer.reclaim_expired()  # reads the feed
    assert producer_store.health().sample_count == 0


def test_a_sample_requeued_and_acked_by_another_instance_reaches_its_producer(make: Factory, tmp_path: Path) -> None:
    """A requeue's put token names no instance: the producer still learns the settle from the feed."""
    producer_store, other_store = SharedDirFeatureStore(tmp_path), SharedDirFeatureStore(tmp_path)
    producer = make(producer_store, max_deliveries=1, keep_dead_letter_bytes=1 << 30)
    other = make(other_store, max_deliveries=1, keep_dead_letter_bytes=1 << 30)
    put(producer_store, producer, "s0")
    other.fail(other.acquire(timeout=0))  # type: ignore[arg-type]  # a kept dead letter: still retained
    assert other.requeue_dead_letters() == ["s0"]
    other.ack(other.acquire(timeout=0))  # type: ignore[arg-type]
    assert producer_store.is_resident("s0")  # nothing told it yet
    producer.reclaim_expired()
    assert not producer_store.is_resident("s0")


def test_calls_survive_the_server_dropping_every_connection(
    make: Factory, store: LocalFeatureStore, redis_client: Any
) -> None:
    queue = make(store)
    put(store, queue, "s0")
    redis_client.client_kill_filter(_type="normal", skipme=True)
    lease = queue.acquire(timeout=0)
    assert lease is not None and lease.ref.sample_id == "s0"
    redis_client.client_kill_filter(_type="normal", skipme=True)
    queue.ack(lease)
    stats = queue.stats()
    assert (stats.put, stats.acked, stats.pending, stats.outstanding) == (1, 1, 0, 0)
    assert not store.is_resident("s0")


@pytest.mark.parametrize("shape", ["single_connection_client", "shared_client", "decode_responses"])
def test_other_client_shapes_work(make: Factory, store: LocalFeatureStore, redis_server: Any, shape: str) -> None:
    client = redis.Redis.from_url(
        redis_server.url,
        single_connection_client=shape == "single_connection_client",
        decode_responses=shape == "decode_responses",
    )
    try:
        first, second = make(store, client=client), make(store, client=client)
        put(store, first, "s0")
        lease = second.acquire(timeout=0)
        age = second.oldest_lease_age()
        assert age is not None and 0 <= age < 30
        second.ack(lease)  # type: ignore[arg-type]
        assert first.stats().acked == 1 and first.acquire(timeout=0) is None and first.oldest_lease_age() is None
    finally:
        client.close()


def test_threads_sharing_one_instance_settle_every_sample_once(make: Factory) -> None:
    store = LocalFeatureStore()
    queue = make(store)
    acked: list[str] = []
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            for i in range(40):
                put(store, queue, f"w{worker}-{i}")
                lease = queue.acquire(timeout=5)
                assert lease is not None
                queue.ack(lease)
                acked.append(lease.ref.sample_id)
        except BaseException as exc:  # reported below: an assert in a thread would vanish
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert sorted(acked) == sorted(f"w{worker}-{i}" for worker in range(4) for i in range(40))
    stats = queue.stats()
    assert (stats.put, stats.acked, stats.stale_rejected, stats.pending) == (160, 160, 0, 0)


def test_disconnect_closes_the_instances_connections(
    make: Factory, store: LocalFeatureStore, redis_client: Any
) -> None:
    before = len(redis_client.client_list())
    queue = make(store)
    put(store, queue, "s0")
    queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    assert len(redis_client.client_list()) > before
    queue.disconnect()
    assert len(redis_client.client_list()) == before


def test_the_hot_path_packs_each_request_exactly_as_redis_py_does(redis_server: Any) -> None:
    from redis.utils import HIREDIS_AVAILABLE

    from featurestream.backends.redis import functions
    from featurestream.backends.redis.link import Link

    client = redis.Redis.from_url(redis_server.url)
    try:
        link = Link(client, "pack", functions.LIBRARY, 1.0)
        conn = link._conn
        assert conn is not None
        if HIREDIS_AVAILABLE:
            assert link._pack is not Link._pack_command, "hiredis is installed: the hot path packs with it directly"
        args = ("FCALL", "fs_x_put", 1, link.prefix, "\t3\t10\t$\t", "sample-é\t1", b'{"v":1}\x00', "", 0, 123456)
        assert b"".join(link._pack(conn, *args)) == b"".join(conn.pack_command(*args))
        link.close()
    finally:
        client.close()


def test_a_lifecycle_is_three_function_calls_of_at_most_26_commands(make: Factory, store: LocalFeatureStore) -> None:
    """Put, acquire, ack one by one, nobody waiting: the command budget of layout 3 (INFO commandstats counts the
    commands a function runs). A deterministic guard for the benchmark's cost: no stream command on the delivery
    path (XADD, XREADGROUP, XACK, XTRIM: layout 2 ran them) and no write to ``wake``."""
    queue = make(store)
    put(store, queue, "warm")
    queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    admin = queue._redis
    admin.config_resetstat()
    lifecycles = 20
    for n in range(lifecycles):
        put(store, queue, f"s{n}")
        queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    calls = {
        name.removeprefix("cmdstat_"): entry["calls"]
        for name, entry in admin.info("commandstats").items()
        if name not in ("cmdstat_info", "cmdstat_config|resetstat")
    }
    assert calls.pop("fcall") == 3 * lifecycles
    assert not {"xadd", "xreadgroup", "xack", "xtrim"} & calls.keys(), calls
    assert sum(calls.values()) <= 26 * lifecycles, {name: count / lifecycles for name, count in calls.items()}
