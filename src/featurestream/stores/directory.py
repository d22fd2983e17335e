"""The store directory itself: checking it is usable, and telling whether a writer's process lives."""

from __future__ import annotations

import errno
import os
import tempfile

__all__ = ["alive", "prepare_directory"]


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
