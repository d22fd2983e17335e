"""A Mooncake client's first contact: its C++ logs kept quiet, its master and metadata server reached first.

Mooncake's transfer engine logs through glog to stderr (about 17 lines per process when all goes well, one
of them an ``E`` line from its first metadata lookup; hundreds while it retries an address nobody serves).
``quiet_logs`` raises glog's threshold to FATAL unless ``MC_LOG_LEVEL`` is set (``INFO``, ``WARNING`` or
``ERROR``: then Mooncake logs as that says). featurestream reports every failure itself, with Mooncake's error
code, so nothing is lost by default.

A client set up against an address where no master listens retries for about 90 s before it fails; ``reach``
tries a TCP connection to the master and to an HTTP metadata server first, for ``FIRST_CONTACT_TIMEOUT``
seconds, and raises ``ConnectionError`` naming the address and what to do.
"""

from __future__ import annotations

import ctypes
import os
import socket
import time
from types import ModuleType
from urllib.parse import urlsplit

__all__ = ["FIRST_CONTACT_TIMEOUT", "LOG_LEVEL_VARIABLE", "quiet_logs", "reach"]

# How long a store's first contact with its master may take before it is refused: a wrong address should fail
# in seconds, and a master that is starting is up well within it.
FIRST_CONTACT_TIMEOUT = 3.0

# Set it (INFO, WARNING, ERROR) to see Mooncake's own logs; unset, they are off.
LOG_LEVEL_VARIABLE = "MC_LOG_LEVEL"

# glog's minimum level flag in the Mooncake extension (3: FATAL, so nothing below it is written).
_GLOG_MIN_LEVEL = "_ZN3fLI17FLAGS_minloglevelE"
_FATAL = 3


def quiet_logs(extension: ModuleType) -> None:
    """Turn off the glog output of ``extension`` (``mooncake.store``) unless ``MC_LOG_LEVEL`` asks for it."""
    if os.environ.get(LOG_LEVEL_VARIABLE):
        return
    try:
        level = ctypes.c_int.in_dll(ctypes.CDLL(extension.__file__), _GLOG_MIN_LEVEL)
    except (OSError, ValueError, TypeError):  # another build of Mooncake: its logs stay as they are
        return
    level.value = _FATAL


def _endpoint(address: str) -> tuple[str, int] | None:
    """``host:port`` as a pair; ``None`` for an address of another form (``etcd://...`` and the like)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or "/" in address or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def reach(master_server_address: str, metadata_server: str, timeout: float = FIRST_CONTACT_TIMEOUT) -> None:
    """``ConnectionError`` unless the master (``host:port``) and an ``http://`` metadata server accept a TCP
    connection within ``timeout`` seconds; addresses of other forms are left to Mooncake."""
    give_up = time.monotonic() + timeout
    targets = [("master", master_server_address, _endpoint(master_server_address))]
    split = urlsplit(metadata_server)
    if split.scheme in ("http", "https") and split.hostname:
        default = 443 if split.scheme == "https" else 80
        try:
            port = split.port or default
        except ValueError:
            raise ValueError(f"metadata_server {metadata_server!r} has no valid port") from None
        targets.append(("metadata server", metadata_server, (split.hostname, port)))
    for role, address, endpoint in targets:
        if endpoint is not None:
            _connect(role, address, endpoint, give_up, timeout)


def _connect(role: str, address: str, endpoint: tuple[str, int], give_up: float, timeout: float) -> None:
    delay = 0.05
    while True:
        try:
            with socket.create_connection(endpoint, timeout=max(0.1, give_up - time.monotonic())):
                return
        except OSError as exc:
            if time.monotonic() + delay > give_up:
                raise ConnectionError(
                    f"cannot reach the Mooncake {role} at {address}: {exc} (tried for {timeout:g} s); is "
                    "mooncake_master running there? Start one (`featurestream serve mooncake`, docs/data-plane.md) "
                    "or fix the address"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
