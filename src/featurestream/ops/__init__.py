"""Operator commands for a shared Redis queue: ``featurestream status`` and ``featurestream dead-letters``."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable

__all__ = ["quiet_when_output_closes"]

Command = Callable[[argparse.Namespace], int]


def quiet_when_output_closes(run: Command) -> Command:
    """Make a command's ``run`` exit 0, without a traceback, when the reader of its stdout goes away (``| head``)."""

    @functools.wraps(run)
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except BrokenPipeError:
            # Point stdout at /dev/null so the interpreter's final flush does not fail again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0

    return wrapper
