"""Mooncake's Python client as the store uses it: loading it, and naming its error codes."""

from __future__ import annotations

import os
from typing import Any

from featurestream.stores.mooncake_contact import quiet_logs

__all__ = ["BUFFER_OVERFLOW", "OBJECT_NOT_FOUND", "TRANSFER_FAIL", "code", "load_mooncake", "load_mooncake_config"]

# Mooncake's error codes this store tells apart (mooncake-store ``ErrorCode``).
BUFFER_OVERFLOW = -600
OBJECT_NOT_FOUND = -704
TRANSFER_FAIL = -800
_CODE_NAMES = {
    -600: "BUFFER_OVERFLOW",
    -700: "INVALID_KEY",
    -703: "OBJECT_ALREADY_EXISTS",
    -704: "OBJECT_NOT_FOUND",
    -706: "OBJECT_HAS_LEASE",
    -800: "TRANSFER_FAIL",
    -900: "RPC_FAIL",
}
# A transfer that fails while the object still exists is retried this often before get gives up with EIO.


def code(rc: int) -> str:
    return f"{_CODE_NAMES.get(rc, 'error')} ({rc})"


def load_mooncake() -> Any:
    """Mooncake's ``store`` module, its client told to copy locally into a segment of its own process.

    ``MC_STORE_MEMCPY=1`` makes a put into this process's own segment (a producer-hosted one) a memcpy rather
    than a transfer to itself over the transport; ``MC_STORE_MEMCPY=0`` in the environment keeps the transport.
    """
    os.environ.setdefault("MC_STORE_MEMCPY", "1")
    try:
        from mooncake import store
    except ImportError as exc:
        raise ImportError(
            "MooncakeFeatureStore needs Mooncake's transfer engine: pip install 'featurestream[mooncake]' "
            "(the CPU/TCP wheel; on GPU clusters install mooncake-transfer-engine), and on Debian/Ubuntu "
            "apt-get install libibverbs1 libnl-3-200 libnl-route-3-200"
        ) from exc
    quiet_logs(store)
    return store


def load_mooncake_config() -> Any:
    load_mooncake()
    from mooncake import mooncake_config

    return mooncake_config
