"""``ServerProcess``: a real server (``redis-server``, ``mooncake_master``) started on 127.0.0.1 for tests,
benchmarks and the demo, on free ports, waited for until it answers, and stopped (or killed) again."""

from __future__ import annotations

import abc
import contextlib
import fcntl
import os
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is 3.11+; the package supports 3.10

__all__ = ["HOST", "ServerProcess", "Started", "free_port", "listening"]

HOST = "127.0.0.1"
_POLL = 0.01


# Every port ``free_port`` returned in this process. The kernel may pick a port again as soon as the probe socket
# is closed, before the server it was picked for binds it: two sentinels of one cluster once got the same port.
_HANDED_OUT: set[int] = set()
_HANDING_OUT = threading.Lock()
# The same across processes (pytest-xdist's workers, a benchmark beside a test run): "<port> <time handed out>"
# lines, under an exclusive flock; a port is reserved for _RESERVED seconds, long enough for its server to bind it.
_REGISTRY = Path(tempfile.gettempdir()) / f"featurestream-ports-{os.getuid()}"
_RESERVED = 600.0


def free_port() -> int:
    """A TCP port on ``HOST`` that nothing listens on right now (the kernel's pick), never one this process was
    handed before, nor one another process on this machine was handed in the last ten minutes."""
    with _HANDING_OUT, open(_REGISTRY, "a+", encoding="ascii") as registry:
        fcntl.flock(registry, fcntl.LOCK_EX)
        registry.seek(0)
        now = time.time()
        reserved = _recent(registry.read(), now)
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((HOST, 0))
                port = int(sock.getsockname()[1])
            if port not in _HANDED_OUT and port not in reserved:
                break
        _HANDED_OUT.add(port)
        reserved[port] = now
        registry.seek(0)
        registry.truncate()
        registry.write("".join(f"{held} {at}\n" for held, at in reserved.items()))
        return port


def _recent(lines: str, now: float) -> dict[int, float]:
    """The registry's ports handed out less than ``_RESERVED`` seconds before ``now`` (a torn line is skipped)."""
    recent = {}
    for line in lines.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0].isdigit():
            with contextlib.suppress(ValueError):
                if now - float(fields[1]) < _RESERVED:
                    recent[int(fields[0])] = float(fields[1])
    return recent


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on ``HOST:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((HOST, port)) == 0


class Started(abc.ABC):
    """Something ``start`` runs and ``stop`` ends: a ``with`` block starts it and stops it on the way out, also
    when the block raises."""

    @abc.abstractmethod
    def start(self) -> None:
        """Run it; return once it serves."""

    @abc.abstractmethod
    def stop(self) -> None:
        """End it (a no-op when it does not run)."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class ServerProcess(Started):
    """One server process: ``command`` says how to run it, ``ready`` when it serves; ``restart(kill=True)``
    SIGKILLs it and starts it again with the same command (same ports, same files).

    Its output goes to ``log`` (appended), or to a temporary file; either way the end of it is in the error
    when the process exits before it is ready.
    """

    name = "server"

    def __init__(self, *, log: str | os.PathLike[str] | None = None) -> None:
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None

    @abc.abstractmethod
    def command(self) -> list[str]:
        """The argument vector that runs the server."""

    @abc.abstractmethod
    def ready(self) -> bool:
        """Whether the started server answers (a failed attempt returns ``False``, it does not raise)."""

    def start(self, timeout: float = 30.0) -> None:
        """Run the server and return once ``ready``; ``RuntimeError`` (with its output) if it exits first,
        ``TimeoutError`` (after killing it) if it is not ready within ``timeout`` seconds."""
        command = self.command()
        self._output = open(self.log, "a+b") if self.log is not None else tempfile.TemporaryFile()
        self.process = subprocess.Popen(command, stdout=self._output, stderr=subprocess.STDOUT)
        give_up = time.monotonic() + timeout
        while not self.ready():
            if self.process.poll() is not None:
                code, output = self.process.returncode, self._tail()
                self._release()
                raise RuntimeError(f"{self.name} exited with {code} (command: {command}): {output}")
            if time.monotonic() > give_up:
                self.stop(kill=True)
                raise TimeoutError(f"{self.name} was not ready within {timeout} s (command: {command})")
            time.sleep(_POLL)

    def stop(self, *, kill: bool = False) -> None:
        """Terminate the server (SIGKILL with ``kill``) and wait for it; idempotent."""
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=15)
        self._release()

    def exited(self) -> bool:
        """Whether the server is not running: never started, stopped, or exited by itself."""
        return self.process is None or self.process.poll() is not None

    def restart(self, *, kill: bool = True) -> None:
        self.stop(kill=kill)
        self.start()

    def _tail(self, limit: int = 2000) -> str:
        assert self._output is not None
        self._output.flush()
        self._output.seek(max(0, self._output.seek(0, os.SEEK_END) - limit))
        return self._output.read().decode(errors="replace")

    def _release(self) -> None:
        self.process = None
        if self._output is not None:
            self._output.close()
            self._output = None
