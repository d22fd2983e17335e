"""The store directory itself: checking it is usable, telling whether a writer's process lives, and sweeping the
temporaries of writers that died inside ``put``."""

from __future__ import annotations

import errno
import os
import socket
import tempfile

__all__ = ["HOST", "TEMP_SUFFIX", "alive", "prepare_directory", "sweep_dead_temporaries"]

TEMP_SUFFIX = ".tmp"
HOST = socket.gethostname().replace(".", "_").replace("-", "_") or "host"  # a temporary's writer: <HOST>-<pid>


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (a zombie counts as gone)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def prepare_directory(directory: str, create: bool) -> None:
    """Make sure ``directory`` is a writable directory, creating it (its parents only with ``create``)."""
    if not os.path.isdir(directory):
        parent = os.path.dirname(directory)
        if os.path.exists(directory):
            raise NotADirectoryError(
                errno.ENOTDIR, f"cannot use {directory} as a store directory: it is not a directory", directory
            )
        if not create and not os.path.isdir(parent):
            raise FileNotFoundError(
                errno.ENOENT,
                f"cannot use {directory} as a store directory: its parent {parent} does not exist "
                "(pass create=True to create the whole path)",
                directory,
            )
        try:
            os.makedirs(directory, exist_ok=True)
        except FileExistsError:
            raise NotADirectoryError(
                errno.ENOTDIR, f"cannot use {directory} as a store directory: it is not a directory", directory
            ) from None
        except OSError as exc:
            raise type(exc)(
                exc.errno, f"cannot create the store directory {directory}: {exc.strerror}", directory
            ) from exc
    try:  # the real test: permissions, a read-only mount, ACLs (os.access misses some, and root passes it)
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".write-check-", suffix=".tmp")
    except OSError as exc:
        raise type(exc)(
            exc.errno, f"cannot use {directory} as a store directory: it is not writable ({exc.strerror})", directory
        ) from exc
    os.close(fd)
    os.unlink(probe)


def sweep_dead_temporaries(directory: str) -> int:
    """Unlink the ``.tmp`` files of writers on this host that died inside ``put`` (SIGKILL); return how many.

    A temporary names its writer (``.<id>.<HOST>-<pid>.<random>.tmp``); one whose process is gone is garbage,
    whatever its age. Temporaries of live processes, and of other hosts (whose processes cannot be probed from
    here), are left alone.
    """
    swept = 0
    for name in os.listdir(directory):
        if not (name.startswith(".") and name.endswith(TEMP_SUFFIX)):
            continue
        parts = name[: -len(TEMP_SUFFIX)].rsplit(".", 2)
        host, _, pid = parts[1].rpartition("-") if len(parts) == 3 else ("", "", "")
        if host != HOST or not pid.isdigit() or alive(int(pid)):
            continue
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            continue  # another instance swept it first
        swept += 1
    return swept
