"""``featurestream demo --sentinel HOST:PORT ... --service NAME``: the demo's queue on a replicated Redis found
through Sentinel, for each algorithm and store, across a SIGKILL of the primary, and its bad input refused.

One password-protected cluster (primary, replica, three sentinels: real ``redis-server`` processes) serves the
module; the passwords reach the demo, and the Mooncake variant's trainer process, only through the environment.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")

from featurestream.backends.redis.queue import RedisSampleRefQueue, list_queues
from featurestream.cli import main
from featurestream.tools.mooncake import missing_reason
from featurestream.tools.redis_servers import RedisNode, ReplicatedRedis

SECRETS = {"password": "s3cret-server-pw", "sentinel_password": "s3cret-sentinel-pw"}
# The smallest run the --redis demo tests use, with a crash every 7 deliveries so leases are reclaimed too.
RUN = ["--samples", "24", "--crash-every", "7", "--no-progress"]
CHECKS = 6


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicatedRedis]:
    try:
        replicated = ReplicatedRedis(tmp_path_factory.mktemp("demo-ha"), **SECRETS)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    with replicated:
        yield replicated


@pytest.fixture
def target(cluster: ReplicatedRedis, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The demo's --sentinel/--service arguments for the healthy cluster, its passwords in the environment."""
    cluster.wait_healthy()
    monkeypatch.delenv("FEATURESTREAM_REDIS_URL", raising=False)
    monkeypatch.setenv("FEATURESTREAM_REDIS_PASSWORD", SECRETS["password"])
    monkeypatch.setenv("FEATURESTREAM_SENTINEL_PASSWORD", SECRETS["sentinel_password"])
    sentinels = [arg for host, port in cluster.sentinel_addresses for arg in ("--sentinel", f"{host}:{port}")]
    return [*sentinels, "--service", cluster.service]


def _checked(out: str, cluster: ReplicatedRedis) -> str:
    """The name of the queue the summary says the run used, once every check passed; no password anywhere."""
    assert "FAILED" not in out and out.count("[ok]") == CHECKS, out
    sentinels = ", ".join(f"{host}:{port}" for host, port in cluster.sentinel_addresses)
    where = re.escape(f"at Sentinel service {cluster.service!r} (sentinels {sentinels})")
    shown = re.search(rf"queue RedisSampleRefQueue '(demo-[0-9a-f]{{12}})' {where} ", out)
    assert shown is not None, out.splitlines()[0]
    assert "s3cret" not in out
    return shown.group(1)


@pytest.mark.parametrize(
    ("algorithm", "store"),
    [("eagle3", "local"), ("dflash", "shared-dir"), ("dspark", "local"), ("eagle3", "mooncake")],
)
def test_the_demo_runs_through_sentinel(
    algorithm: str, store: str, cluster: ReplicatedRedis, target: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Every algorithm and every store the demo runs over Redis (Mooncake: EAGLE-3 only, the trainer in a
    process of its own that reaches the queue through the sentinels too)."""
    if store == "mooncake" and (reason := missing_reason()) is not None:
        pytest.skip(reason)
    assert main(["demo", *target, "--algorithm", algorithm, "--store", store, *RUN]) == 0
    captured = capsys.readouterr()
    name = _checked(captured.out, cluster)
    assert "s3cret" not in captured.err
    assert main(["status", *target, "--name", name, "--json"]) == 0  # where the summary says, status finds it
    assert '"acked": 24' in capsys.readouterr().out


@pytest.mark.parametrize("store", ["local", "mooncake"])
def test_the_demo_survives_a_sigkilled_primary(
    store: str, cluster: ReplicatedRedis, target: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """An operator's handle watches the run's queue; once a few samples are acked the primary is SIGKILLed,
    a replica promoted and the old primary restarted as a replica. The run still ends with every check ok:
    each sample acked exactly once and trained on, nothing left leased or resident (with Mooncake: both
    processes follow the failover). Training itself is at least once here: a step whose lease expired during
    the failover is trained again after its redelivery (exactly once takes the training ledger, docs/resume.md)."""
    if store == "mooncake" and (reason := missing_reason()) is not None:
        pytest.skip(reason)
    connection = {"sentinels": cluster.sentinel_addresses, "service_name": cluster.service, **SECRETS}
    before = set(list_queues(None, **connection))
    old = cluster.primary()
    seen: dict[str, int] = {}
    promoted: list[RedisNode] = []
    errors: list[BaseException] = []

    def kill_mid_run() -> None:
        try:
            give_up = time.monotonic() + 60
            while not (new := set(list_queues(None, **connection)) - before):
                assert time.monotonic() < give_up, "the demo's queue never appeared"
                time.sleep(0.05)
            (name,) = new
            handle = RedisSampleRefQueue.open(None, name, min_replicas=0, **connection)
            try:
                while (acked := handle.stats().acked) < 3:
                    assert time.monotonic() < give_up, "the demo acked nothing"
                    time.sleep(0.02)
            finally:
                handle.disconnect()
            seen["acked"] = acked
            cluster.kill_primary()
            promoted.append(cluster.wait_failover(old))
            cluster.restart(old)
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    killer = threading.Thread(target=kill_mid_run)
    killer.start()
    try:
        status = main(["demo", *target, "--store", store, *RUN])
    finally:
        killer.join(120)
    assert not killer.is_alive(), "the kill, failover or restart hung"
    if errors:
        raise errors[0]
    out = capsys.readouterr().out
    assert status == 0, out
    _checked(out, cluster)
    assert seen["acked"] < 24  # the primary died mid-run ...
    # ... and a replica was promoted: the run went on there (which server is primary now says nothing, as a sentinel
    # on a busy machine may have failed over again since)
    assert promoted and promoted[0] is not old


def test_bad_sentinel_arguments_are_refused_naming_the_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("FEATURESTREAM_REDIS_URL", raising=False)
    assert main(["demo", "--service", "svc", "--samples", "2"]) == 2
    assert "featurestream demo: --service needs --sentinel HOST:PORT" in capsys.readouterr().err
    assert main(["demo", "--sentinel", "127.0.0.1:26379", "--samples", "2"]) == 2
    assert "featurestream demo: --sentinel needs --service NAME" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--redis", "redis://127.0.0.1:6379/0", "--sentinel", "127.0.0.1:26379", "--service", "s"])
    assert exited.value.code == 2
    assert "argument --sentinel: not allowed with argument --redis" in capsys.readouterr().err
    for malformed in ("nowhere", "h:0", "h:port", ":26379"):
        with pytest.raises(SystemExit) as exited:
            main(["demo", "--sentinel", malformed, "--service", "s"])
        assert exited.value.code == 2
        assert f"must be HOST:PORT with a port in 1..65535, got {malformed!r}" in capsys.readouterr().err
    assert main(["demo", "--store", "mooncake", "--samples", "2"]) == 2
    assert "pass --redis redis://HOST:PORT/DB or --sentinel HOST:PORT --service NAME" in capsys.readouterr().err


@pytest.mark.usefixtures("target")  # the passwords in the environment
def test_the_demo_at_a_url_takes_the_password_from_the_environment_and_never_prints_one(
    cluster: ReplicatedRedis, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--redis`` shares the operator commands' rules too: the password from the environment (or in the URL,
    hidden in the summary)."""
    port = cluster.primary().port
    assert main(["demo", "--redis", f"redis://127.0.0.1:{port}/0", *RUN]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and f"at redis://127.0.0.1:{port}/0 (featurestream status" in out
    url = f"redis://:{SECRETS['password']}@127.0.0.1:{port}/0"
    assert main(["demo", "--redis", url, *RUN]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and f"at redis://:***@127.0.0.1:{port}/0 (featurestream status" in out
    assert "s3cret" not in out
