"""``RedisNode`` and ``ReplicatedRedis`` (a primary, its replicas and three sentinels) on local ports, for failover
tests and ``featurestream serve redis|sentinel``.

Every process is a real ``redis-server`` (``--sentinel`` for the sentinels: the server binary runs as one, no
separate package). ``kill_primary`` SIGKILLs whichever server is primary now, ``wait_failover`` returns once
the sentinels agree on a promoted replica, and ``restart`` starts a killed server again as a replica of the
current primary (as an operator brings a lost host back). Short ``down-after-milliseconds`` (1 s) and
``failover-timeout`` (2 s) make a failover take about two seconds; shorter, a busy machine's slow replies to
the sentinels' pings set off failovers of a live primary (seen at 400 ms under load). ``promote`` does not wait
for that: it asks a sentinel to fail over at once (``SENTINEL FAILOVER``), as the stateful kit's failovers do
(``featurestream.testing.redis_faults``), and ``replicas_stopped`` keeps what the primary applies meanwhile off
its replicas.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import redis

from featurestream.tools.servers import HOST, ServerProcess, Started, free_port

__all__ = ["RedisNode", "ReplicatedRedis", "SentinelNode"]

SERVICE = "featurestream"

Answer = TypeVar("Answer")


def _binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        raise FileNotFoundError("redis-server is not on PATH (Debian/Ubuntu: apt-get install redis-server)")
    return binary


class _RedisProcess(ServerProcess):
    """A ``redis-server`` process, data server or sentinel, that clients reach on ``HOST:port`` with ``password``."""

    port: int
    password: str | None

    def client(self) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, password=self.password, socket_connect_timeout=0.5)

    def ask(self, question: Callable[[redis.Redis], Answer], unanswered: Answer) -> Answer:
        """``question`` put to a client of this process (closed after); ``unanswered`` when it cannot be asked."""
        client = self.client()
        try:
            return question(client)
        except redis.RedisError:
            return unanswered
        finally:
            client.close()

    def ready(self) -> bool:
        client = self.client()
        try:
            return bool(client.ping())
        except redis.ConnectionError:  # not listening yet, or still loading its data (BusyLoadingError is one)
            return False
        finally:
            client.close()


class RedisNode(_RedisProcess):
    """One data server, its files and log in ``directory``, on ``port`` (default: a free one); ``replicaof``
    (host, port) starts it as a replica of that primary; ``appendonly`` makes every write durable before it is
    answered (AOF, fsync always), so a SIGKILLed server restarts with every acknowledged write;
    ``min_replicas_to_write`` has it refuse writes (``NOREPLICAS``) while fewer replicas than that are connected
    and acknowledging (within 10 s). ``url`` reaches it (without the password)."""

    name = "redis-server"

    def __init__(
        self,
        directory: Path,
        *,
        password: str | None = None,
        appendonly: bool = False,
        port: int | None = None,
        min_replicas_to_write: int = 0,
    ) -> None:
        super().__init__(log=directory / "server.log")
        self.binary = _binary()
        self.directory = directory
        self.port = free_port() if port is None else port
        self.url = f"redis://{HOST}:{self.port}/0"
        self.password = password
        self.appendonly = appendonly
        self.min_replicas_to_write = min_replicas_to_write
        self.replicaof: tuple[str, int] | None = None

    def command(self) -> list[str]:
        auth = [] if self.password is None else ["--requirepass", self.password, "--masterauth", self.password]
        follow = [] if self.replicaof is None else ["--replicaof", self.replicaof[0], str(self.replicaof[1])]
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly else ["--appendonly", "no"]
        if self.min_replicas_to_write:
            persistence += ["--min-replicas-to-write", str(self.min_replicas_to_write), "--min-replicas-max-lag", "10"]
        return [
            self.binary,
            "--port", str(self.port),
            "--bind", HOST,
            "--dir", str(self.directory),
            "--save", "",
            *persistence,
            "--daemonize", "no",
            "--protected-mode", "no",
            "--loglevel", "warning",
            "--repl-diskless-sync", "yes",
            "--repl-diskless-sync-delay", "0",
            *auth,
            *follow,
        ]  # fmt: skip


class SentinelNode(_RedisProcess):
    """One sentinel watching ``primary`` as ``SERVICE`` (quorum 2); its config file is its own (it rewrites it)."""

    name = "redis-sentinel"

    def __init__(
        self,
        directory: Path,
        primary: RedisNode,
        *,
        down_after_ms: int,
        failover_timeout_ms: int,
        password: str | None = None,
    ) -> None:
        super().__init__(log=directory / "sentinel.log")
        self.binary = _binary()
        self.port = free_port()
        self.password = password
        self.config = directory / "sentinel.conf"
        lines = [
            f"port {self.port}",
            f"bind {HOST}",
            f"dir {directory}",
            "protected-mode no",
            f"sentinel monitor {SERVICE} {HOST} {primary.port} 2",
            f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}",
            f"sentinel failover-timeout {SERVICE} {failover_timeout_ms}",
            f"sentinel parallel-syncs {SERVICE} 1",
        ]
        if primary.password is not None:
            lines.append(f"sentinel auth-pass {SERVICE} {primary.password}")
        if password is not None:
            lines.append(f"requirepass {password}")
        self.config.write_text("\n".join(lines) + "\n")

    def command(self) -> list[str]:
        return [self.binary, str(self.config), "--sentinel", "--loglevel", "warning"]

    def primary(self) -> tuple[str, int] | None:
        """The primary this sentinel names for ``SERVICE`` now (``None`` when it cannot be asked)."""
        found = self.ask(lambda client: client.sentinel_get_master_addr_by_name(SERVICE), None)
        return None if found is None else (str(found[0]), int(found[1]))


class ReplicatedRedis(Started):
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels (quorum 2), started in ``directory``.

    ``sentinel_addresses`` is what a queue's ``sentinels=`` takes, with ``service_name=SERVICE``. ``password``
    (optional) protects the data servers, ``sentinel_password`` the sentinels; ``appendonly`` and
    ``min_replicas_to_write`` are each data server's (see ``RedisNode``).
    """

    def __init__(
        self,
        directory: Path,
        *,
        replicas: int = 1,
        sentinels: int = 3,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 2000,
        password: str | None = None,
        sentinel_password: str | None = None,
        appendonly: bool = False,
        min_replicas_to_write: int = 0,
    ) -> None:
        self.service = SERVICE
        self.password = password
        self.sentinel_password = sentinel_password
        self.servers = [
            RedisNode(
                self._dir(directory, f"server{i}"),
                password=password,
                appendonly=appendonly,
                min_replicas_to_write=min_replicas_to_write,
            )
            for i in range(replicas + 1)
        ]
        for replica in self.servers[1:]:
            replica.replicaof = (HOST, self.servers[0].port)
        self.sentinels = [
            SentinelNode(
                self._dir(directory, f"sentinel{i}"),
                self.servers[0],
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
                password=sentinel_password,
            )
            for i in range(sentinels)
        ]

    @staticmethod
    def _dir(directory: Path, name: str) -> Path:
        path = directory / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [(HOST, sentinel.port) for sentinel in self.sentinels]

    def start(self, timeout: float = 30.0) -> None:
        """Start every process; return once the replicas are in sync and every sentinel sees them all."""
        try:
            for server in self.servers:
                server.start()
            self.wait_replicas(len(self.servers) - 1, timeout)
            for sentinel in self.sentinels:
                sentinel.start()
            self._wait_sentinels(timeout)
        except BaseException:
            self.stop()
            raise

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until the last failover has settled: a majority of the sentinels name one primary, which answers as one,
        every other running server replicates from it with its link up, and the sentinels see them all."""
        give_up = time.monotonic() + timeout
        while not self._settled():
            if time.monotonic() > give_up:
                raise TimeoutError(f"the servers and sentinels did not settle within {timeout} s")
            time.sleep(0.05)
        self.wait_replicas(sum(1 for server in self.servers if server.process is not None) - 1, timeout)
        self._wait_sentinels(timeout)

    def _settled(self) -> bool:
        address = self._named()
        if address is None:
            return False
        for server in self.servers:
            if server.process is None:
                continue
            info = server.ask(lambda client: client.info("replication"), None)
            if info is None:
                return False
            if server.port == address[1]:
                if info.get("role") != "master":
                    return False
            elif info.get("master_port") != address[1] or info.get("master_link_status") != "up":
                return False
        return True

    def _named(self) -> tuple[str, int] | None:
        """The primary a majority of the sentinels name now (``None`` when no majority agrees): one sentinel
        may lag, e.g. in TILT mode after a stall on a busy machine."""
        votes: dict[tuple[str, int], int] = {}
        for sentinel in self.sentinels:
            address = sentinel.primary()
            if address is not None:
                votes[address] = votes.get(address, 0) + 1
        best = max(votes, key=votes.__getitem__, default=None)
        return best if best is not None and 2 * votes[best] > len(self.sentinels) else None

    def primary(self) -> RedisNode:
        """The server a majority of the sentinels name as primary now."""
        address = self._named()
        if address is None:
            raise LookupError("no majority of the sentinels names a primary")
        return next(server for server in self.servers if server.port == address[1])

    def kill_primary(self) -> RedisNode:
        """SIGKILL the current primary (as if its host were lost); returns it (``restart`` it later)."""
        primary = self.primary()
        primary.stop(kill=True)
        return primary

    def wait_failover(self, old: RedisNode, timeout: float = 30.0) -> RedisNode:
        """Once a majority of the sentinels name another primary than ``old`` and it answers as one: it."""
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            address = self._named()
            if address is not None and address[1] != old.port:
                server = next(server for server in self.servers if server.port == address[1])
                if self._role(server) == "master":
                    return server
            time.sleep(0.05)
        raise TimeoutError(f"no failover away from port {old.port} within {timeout} s")

    def replicas(self) -> list[RedisNode]:
        """The running servers other than the primary now."""
        primary = self.primary()
        return [server for server in self.servers if server.process is not None and server is not primary]

    @contextlib.contextmanager
    def replicas_stopped(self, *, cut: bool = False) -> Iterator[RedisNode]:
        """SIGSTOP every replica for the block (``resume`` after, also when it raises); yields the primary.

        A stopped replica acknowledges nothing, so a ``WAIT`` on the primary blocks, but what the primary sends
        meanwhile still lands in the replica's socket buffer and is applied once it runs again. ``cut`` also has
        the primary drop its replicas' connections (``CLIENT KILL TYPE replica``): then what it applies in the
        block stays on it alone, to be lost with it. Keep the block well under ``down-after-milliseconds``: a
        replica silent that long is down to the sentinels, and no longer promoted.
        """
        primary = self.primary()
        stopped = self.replicas()
        try:
            for replica in stopped:
                assert replica.process is not None
                replica.process.send_signal(signal.SIGSTOP)
            if cut:
                client = primary.client()
                try:
                    client.client_kill_filter(_type="replica")
                finally:
                    client.close()
            yield primary
        finally:
            self.resume()

    def resume(self) -> None:
        """SIGCONT every running server: those ``replicas_stopped`` stopped run again (the others ignore it)."""
        for server in self.servers:
            if server.process is not None:
                server.process.send_signal(signal.SIGCONT)

    @staticmethod
    def waiting(server: RedisNode) -> bool:
        """Whether a client of ``server`` is blocked in ``WAIT`` (a call's effect applied, its reply held back
        until replicas have it); ``False`` when it cannot be asked."""

        def blocked(client: redis.Redis) -> bool:
            return any(c.get("cmd") == "wait" and "b" in c.get("flags", "") for c in client.client_list())

        return server.ask(blocked, False)

    def promote(self, old: RedisNode, timeout: float = 30.0) -> RedisNode:
        """Once ``old``, the primary, is dead: a replica promoted at once (``SENTINEL FAILOVER``, not after
        ``down-after-milliseconds``), once it has applied everything ``old`` sent it; returns it.

        A replica still reading what ``old`` sent before dying would be promoted without it, so this waits until
        every replica has read to the end of the dead link (its ``master_link_status`` is down). A sentinel that
        has no replica it would promote yet (``NOGOODSLAVE``) is asked again; one already failing over (``INPROG``)
        is left to it.
        """
        give_up = time.monotonic() + timeout
        replicas = [server for server in self.servers if server.process is not None and server is not old]
        while not all(self._link_down(replica) for replica in replicas):
            if time.monotonic() > give_up:
                raise TimeoutError(f"the replicas still read from the dead primary {old.port} after {timeout} s")
            time.sleep(0.01)
        while not self._failover_started():
            if time.monotonic() > give_up:
                raise TimeoutError(f"no sentinel would fail over from the dead primary {old.port} within {timeout} s")
            time.sleep(0.05)
        return self.wait_failover(old, max(0.0, give_up - time.monotonic()))

    @staticmethod
    def _tilted(sentinel: SentinelNode) -> bool:
        return sentinel.ask(lambda client: bool(client.info("sentinel").get("sentinel_tilt")), True)

    @staticmethod
    def _link_down(replica: RedisNode) -> bool:
        return replica.ask(lambda client: client.info("replication").get("master_link_status") != "up", False)

    def _failover_started(self) -> bool:
        """Ask each sentinel to fail over until one has it under way; whether one has. Sentinels in TILT mode
        (their timer stalled, on a busy machine) come last: they accept the request but act on nothing for 30 s."""
        for sentinel in sorted(self.sentinels, key=self._tilted):
            client = sentinel.client()
            try:
                client.sentinel_failover(SERVICE)
                return True
            except redis.ResponseError as exc:
                if "INPROG" in str(exc):
                    return True
            except redis.RedisError:
                pass
            finally:
                client.close()
        return False

    def restart(self, server: RedisNode) -> None:
        """Start a killed server again, as a replica of the current primary, and wait until it is in sync."""
        primary = self.primary()
        server.replicaof = (HOST, primary.port)
        server.start()
        self.wait_replicas(sum(1 for s in self.servers if s.process is not None) - 1)

    def wait_replicas(self, count: int, timeout: float = 30.0) -> None:
        """Until the current primary (the first server before the sentinels run) has ``count`` replicas online."""
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            try:
                primary = self.primary() if any(s.process is not None for s in self.sentinels) else self.servers[0]
            except LookupError:  # the sentinels are between two views: ask again
                time.sleep(0.05)
                continue
            info = primary.ask(lambda client: client.info("replication"), {})
            online = [value for key, value in info.items() if key.startswith("slave") and isinstance(value, dict)]
            if sum(1 for replica in online if replica.get("state") == "online") >= count:
                return
            time.sleep(0.05)
        raise TimeoutError(f"the primary did not get {count} replica(s) online within {timeout} s")

    def _wait_sentinels(self, timeout: float) -> None:
        """Until each sentinel knows every replica and the other sentinels (so a failover can be agreed)."""
        give_up = time.monotonic() + timeout
        replicas = sum(1 for server in self.servers if server.process is not None) - 1
        others = len(self.sentinels) - 1
        while time.monotonic() < give_up:
            ready = 0
            for sentinel in self.sentinels:
                state = sentinel.ask(lambda client: client.sentinel_master(SERVICE), None)
                if state is None:
                    continue
                if not state["is_sdown"] and state["num-slaves"] >= replicas and state["num-other-sentinels"] >= others:
                    ready += 1
            if ready == len(self.sentinels):
                return
            time.sleep(0.1)
        raise TimeoutError(f"the sentinels did not discover {replicas} replica(s) and each other within {timeout} s")

    @staticmethod
    def _role(server: RedisNode) -> str | None:
        return server.ask(lambda client: str(client.info("replication").get("role")), None)

    def stop(self) -> None:
        for process in [*self.sentinels, *self.servers]:
            process.stop(kill=True)
