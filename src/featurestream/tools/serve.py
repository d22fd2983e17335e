"""``featurestream serve redis|sentinel|mooncake``: one command per server the library talks to, for local use.

Each starts its servers on 127.0.0.1 in the foreground, prints how to connect (the first line of its output:
what a queue's or a store's keywords, or the other commands' flags, take), and stops them on Ctrl-C or
``SIGTERM``. The settings are the ones ``docs/redis.md`` and ``docs/data-plane.md`` give for production, but on
one machine; the docs say what to change for several.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from types import FrameType

from featurestream.tools.servers import HOST, ServerProcess, Started

__all__ = ["configure", "run"]

# How often the foreground loop checks that its servers still run.
_POLL = 0.5


def configure(parser: argparse.ArgumentParser) -> None:
    servers = parser.add_subparsers(dest="server", required=True, metavar="SERVER")
    redis = servers.add_parser("redis", help="a redis-server with AOF (appendfsync always)")
    redis.add_argument("--port", type=int, default=6379, help="its port (default 6379; 0: a free one)")
    sentinel = servers.add_parser("sentinel", help="a primary, replicas and three sentinels, to try failover")
    sentinel.add_argument("--replicas", type=int, default=2, help="replicas of the primary (default 2)")
    mooncake = servers.add_parser("mooncake", help="a mooncake_master with its HTTP metadata server")
    mooncake.add_argument("--port", type=int, default=50051, help="the master's RPC port (default 50051; 0: free)")
    mooncake.add_argument(
        "--metadata-port", type=int, default=8080, help="the metadata server's port (default 8080; 0: free)"
    )
    for sub in (redis, sentinel, mooncake):
        sub.add_argument(
            "--dir", type=Path, default=None, help="where its data and logs go (default ./featurestream-SERVER)"
        )


def run(args: argparse.Namespace) -> int:
    directory: Path = args.dir or Path(f"featurestream-{args.server}")
    directory.mkdir(parents=True, exist_ok=True)
    started, processes, connect = _servers(args, directory.resolve())
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with started:
            print(connect, flush=True)
            print(f"data and logs in {directory.resolve()}; Ctrl-C stops it", flush=True)
            while not stop.wait(_POLL):
                dead = [process.name for process in processes if process.exited()]
                if dead:
                    print(f"{', '.join(dead)} exited; see the logs in {directory.resolve()}", flush=True)
                    return 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _servers(args: argparse.Namespace, directory: Path) -> tuple[Started, list[ServerProcess], str]:
    """The servers ``args`` asks for (not started yet), their processes, and the line that says how to connect."""
    if args.server == "redis":
        from featurestream.tools.redis_servers import RedisNode

        node = RedisNode(directory, appendonly=True, port=args.port or None)
        return node, [node], f"url={node.url}"
    if args.server == "sentinel":
        from featurestream.tools.redis_servers import ReplicatedRedis

        cluster = ReplicatedRedis(directory, replicas=args.replicas, appendonly=True, min_replicas_to_write=1)
        flags = " ".join(f"--sentinel {host}:{port}" for host, port in cluster.sentinel_addresses)
        service = f"service_name={cluster.service!r} ({flags} --service {cluster.service})"
        connect = f"sentinels={cluster.sentinel_addresses} {service}"
        return cluster, [*cluster.servers, *cluster.sentinels], connect
    from featurestream.tools.mooncake import MooncakeMaster

    master = MooncakeMaster(
        log=directory / "master.log", rpc_port=args.port or None, metadata_port=args.metadata_port or None
    )
    connect = (
        f"master_server_address={master.master_server_address!r} metadata_server={master.metadata_server!r} "
        f"local_hostname={HOST!r} protocol='tcp' (export MC_TCP_BIND_ADDRESS={HOST} in its clients on this machine)"
    )
    return master, [master], connect
