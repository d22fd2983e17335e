"""``MooncakeMaster``: a real ``mooncake_master`` on 127.0.0.1 for tests, benchmarks and the demo.

It listens on free ports with its built-in HTTP metadata server, and sets
``MC_TCP_BIND_ADDRESS=127.0.0.1`` in this process (children inherit it) so
the transfer engine binds loopback instead of the machine's external
interface, where transfers between local processes fail intermittently.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from featurestream.tools.servers import HOST, ServerProcess, free_port, listening

__all__ = ["MooncakeMaster", "find_master_binary", "missing_reason"]


def find_master_binary() -> str | None:
    """The ``mooncake_master`` the Mooncake wheel installed next to this interpreter, else the one on PATH."""
    beside = Path(sys.executable).with_name("mooncake_master")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("mooncake_master")


INSTALL_HINT = (
    "pip install 'featurestream[mooncake]' and, on Debian/Ubuntu, apt-get install libibverbs1 libnl-3-200 "
    "libnl-route-3-200 (scripts/test.sh does both)"
)


def missing_reason() -> str | None:
    """Why Mooncake cannot run here (its client does not load, or no ``mooncake_master``); ``None`` when it can."""
    try:
        import mooncake.store  # noqa: F401 - only probing that the wheel and its libraries load
    except ImportError as exc:
        return f"Mooncake's client does not load ({exc}); {INSTALL_HINT}"
    if find_master_binary() is None:
        return f"mooncake_master is not installed; {INSTALL_HINT}"
    return None


class MooncakeMaster(ServerProcess):
    """One ``mooncake_master`` process, on ``rpc_port`` and ``metadata_port`` (default: free ones);
    ``restart(kill=True)`` SIGKILLs it and starts a fresh one on the same ports.

    A restarted master forgets every object (no HA, no snapshots): what a
    lost-bytes test needs. ``client_ttl`` (seconds) is how long the master
    keeps a client's segment, and the objects in it, after its heartbeats stop.
    """

    name = "mooncake_master"

    def __init__(
        self,
        *,
        binary: str | None = None,
        client_ttl: int = 10,
        log: str | os.PathLike[str] | None = None,
        rpc_port: int | None = None,
        metadata_port: int | None = None,
    ):
        found = binary or find_master_binary()
        if found is None:
            raise FileNotFoundError(
                "mooncake_master is not installed: pip install 'featurestream[mooncake]' (it ships the binary)"
            )
        super().__init__(log=log)
        self.binary = found
        self.client_ttl = client_ttl
        self.metadata_port = metadata_port or free_port()
        self.rpc_port = rpc_port or free_port()
        self.metrics_port = free_port()
        os.environ["MC_TCP_BIND_ADDRESS"] = HOST

    @property
    def master_server_address(self) -> str:
        return f"{HOST}:{self.rpc_port}"

    @property
    def metadata_server(self) -> str:
        return f"http://{HOST}:{self.metadata_port}/metadata"

    def store_kwargs(self, **overrides: Any) -> dict[str, Any]:
        """``MooncakeFeatureStore`` keywords for a client of this master (``overrides`` win)."""
        return {
            "master_server_address": self.master_server_address,
            "metadata_server": self.metadata_server,
            "local_hostname": HOST,
            "protocol": "tcp",
            **overrides,
        }

    def command(self) -> list[str]:
        return [
            self.binary,
            "--enable_http_metadata_server=true",
            f"--http_metadata_server_host={HOST}",
            f"--http_metadata_server_port={self.metadata_port}",
            f"--rpc_address={HOST}",
            f"--rpc_port={self.rpc_port}",
            f"--metrics_host={HOST}",
            f"--metrics_port={self.metrics_port}",
            f"--client_ttl={self.client_ttl}",
        ]

    def ready(self) -> bool:
        return listening(self.rpc_port) and listening(self.metadata_port)
