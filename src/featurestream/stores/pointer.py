"""``<id>.safetensors`` in a shared directory: the reference's name of a sample, a link to the data file of its id's
latest put (a reader that knows only the reference's layout finds the current sample there)."""

from __future__ import annotations

import contextlib
import os
import stat

__all__ = ["point_at", "unpoint"]


def point_at(pointer: str, data_name: str, aside: str, sample: str) -> None:
    """Make ``pointer`` a link naming ``data_name`` (relative: nodes may mount the directory at other paths).

    An earlier put's link is replaced atomically through the unused name ``aside``, so a concurrent ``stat``
    always finds one. ``ValueError`` naming ``sample`` when a regular file holds the name: a sample in the
    reference's layout, never replaced.
    """
    try:
        os.symlink(data_name, pointer)
        return
    except FileExistsError:
        pass
    try:
        plain = not stat.S_ISLNK(os.lstat(pointer).st_mode)
    except FileNotFoundError:
        plain = False  # removed meanwhile: the replace below creates it
    if plain:
        raise ValueError(
            f"{sample} is already present as {pointer} (the reference's layout): a sample already present is "
            "never overwritten"
        )
    os.symlink(data_name, aside)
    try:
        os.replace(aside, pointer)
    except BaseException:
        os.unlink(aside)
        raise


def unpoint(pointer: str, data_name: str, aside: str) -> None:
    """Remove ``pointer`` if it links to ``data_name``; a later put's link stays.

    The link is moved aside (to the unused name ``aside``) before it is read, so a re-put that replaces it
    meanwhile is never the one removed; one taken by mistake is linked back unless a newer one is there
    already. A link left behind (an error, a killed process) only ever dangles, and a dangling link reads as
    not resident.
    """
    try:
        os.rename(pointer, aside)
    except OSError:
        return  # no link (another instance took it), or it cannot be moved: it is left to dangle
    try:
        # Not this put's link -- a later put's, or a file a tool wrote under the name (the reference's layout) --
        # goes back.
        if not os.path.islink(aside) or os.readlink(aside) != data_name:
            with contextlib.suppress(FileExistsError):
                os.link(aside, pointer, follow_symlinks=False)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(aside)
