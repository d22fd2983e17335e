"""The suite's one ``redis-server`` launcher (real servers, no fakes) and a wrong-protocol server for error tests.

Importing it skips the test where redis-py is missing; ``RedisServer`` skips where no ``redis-server`` 7.0+ is
installed (CI turns both skips into failures).
"""

from __future__ import annotations

import contextlib
import http.server
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")

from featurestream.tools.redis_servers import RedisNode

INSTALL_HINT = "install it (Debian/Ubuntu: apt-get install redis-server; macOS: brew install redis)"


class RedisServer(RedisNode):
    """``RedisNode``, skipped where no ``redis-server`` 7.0+ is installed; ``restart(kill=True)`` SIGKILLs it and
    starts it again on the same port and directory."""

    def __init__(self, directory: Path, *, appendonly: bool) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip(f"redis-server is not on PATH; {INSTALL_HINT}")
        version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True).stdout
        found = re.search(r"v=(\d+)\.", version)
        if found is None or int(found.group(1)) < 7:
            pytest.skip(f"RedisSampleRefQueue needs redis-server 7.0+ (Redis Functions), found: {version.strip()}")
        super().__init__(directory, appendonly=appendonly)


@contextlib.contextmanager
def http_server() -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 (the standard library's, answering 400 to what Redis clients send); yields
    a redis:// URL pointing at it, as a user who typed the wrong port would."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"redis://127.0.0.1:{server.server_address[1]}/0"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _QuietHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass
