"""The demo's progress bar in a log (stderr not a terminal): a few distinct lines, not one per redraw."""

from __future__ import annotations

import itertools
import time

import pytest

from featurestream.cli import main
from featurestream.tools.demo import ProgressLines


def test_a_logged_demo_writes_a_few_distinct_progress_lines(capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    assert main(["demo", "--samples", "24", "--seed", "3", "--consumers", "3"]) == 0
    elapsed = time.monotonic() - started
    lines = [line for line in capsys.readouterr().err.splitlines() if " acked  loss " in line]
    assert lines[-1].startswith("[##############################] 24/24 acked"), lines
    assert all(a != b for a, b in itertools.pairwise(lines)), f"repeated lines: {lines}"
    assert len(lines) <= 2 + elapsed / 5, f"{len(lines)} lines in {elapsed:.0f} s: {lines}"
    assert not any("\r" in line for line in lines)


def test_progress_lines_in_a_log_skip_repeats_and_throttle(capsys: pytest.CaptureFixture[str]) -> None:
    progress = ProgressLines(interval=60.0)
    assert not progress.live  # pytest's capture is no terminal
    for line in ("a", "a", "b", "c"):  # "b" and "c" come within the interval: only "a" is written now
        progress.show(line)
    progress.last("c")
    progress.last("c")
    assert capsys.readouterr().err == "a\nc\n"
