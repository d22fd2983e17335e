"""The kit's report of a broken store, as a user's pytest prints it: a few readable lines, the right invariant.

Each seeded store bug is run the way ``docs/testing.md`` tells a user to (a
``make_queue_machine(...).TestCase`` in their own test file, their own pytest
configuration, the ``ci`` profile), in a pytest subprocess; the test then
reads the failure report itself: the invariant that names the bug, the
sample and the store method at fault, the shrunk rules without invariant
calls, none of the queue's logs of the kit's own injected faults, and all of
it on one screen.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from featurestream.core.lease import StaleLog
from featurestream.testing import InjectedFault
from featurestream.testing.report import InjectedCallbackError, quiet_injected_faults

SCREEN_LINES = 60

USER_TESTS = """
import dataclasses

from featurestream import LocalFeatureStore
from featurestream.testing import make_queue_machine


class NoScrubStore(LocalFeatureStore):
    def scrub(self, ref):
        pass


class HealthOffByOneStore(LocalFeatureStore):
    def health(self):
        health = super().health()
        if not health.sample_count:
            return health
        return dataclasses.replace(health, resident_bytes=health.resident_bytes + 1)


class ReleaseFreesStore(LocalFeatureStore):
    def retain(self, ref):
        pass


class ScrubRaisesStore(LocalFeatureStore):
    def scrub(self, ref):
        raise KeyError(ref.sample_id)


class StaleRetainRaisesStore(LocalFeatureStore):
    def retain(self, ref):
        if self._entry(ref) is None:  # this put is gone (a later put of the id may be resident)
            raise KeyError(ref.sample_id)
        super().retain(ref)


TestNoScrub = make_queue_machine(NoScrubStore).TestCase
TestHealthOffByOne = make_queue_machine(HealthOffByOneStore).TestCase
TestReleaseFrees = make_queue_machine(ReleaseFreesStore).TestCase
TestScrubRaises = make_queue_machine(ScrubRaisesStore).TestCase
TestStaleRetainRaises = make_queue_machine(StaleRetainRaisesStore).TestCase
"""

# test class -> (invariant, what the message must say about the culprit, log records captured)
EXPECTED = {
    "TestNoScrub": ("inv05_no_leak", r"suspect: store\.scrub\(\) was called for it and did not free it", 0),
    "TestHealthOffByOne": ("inv06_residency_exact", r"suspect: store\.health\(\) \(resident_bytes off by \+1\)", 0),
    "TestReleaseFrees": (
        "inv04_no_loss",
        r"suspect: store\.retain\(\) did not retain it, or store\.release\(\) frees",
        0,
    ),
    # the store's own error, which the queue survives and logs: once with its traceback, not once per example
    "TestScrubRaises": ("inv05_no_leak", r"suspect: store\.scrub\(\) was called for it and did not free it", 1),
    # the contract's unwritten rule, written: a stale incarnation's retain raises nothing
    "TestStaleRetainRaises": (
        "inv16_incarnations_never_cross",
        r"store\.retain\(\) of the earlier put of 's\d'.* raised KeyError\('s\d'\): .* raise nothing",
        0,
    ),
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each test class's failure section of one pytest run of ``USER_TESTS`` in a fresh project directory."""
    project: Path = tmp_path_factory.mktemp("user_project")
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "conftest.py").write_text("from featurestream.testing import load_profile\n\nload_profile()\n")
    (project / "test_my_store.py").write_text(textwrap.dedent(USER_TESTS))
    env = {**os.environ, "HYPOTHESIS_PROFILE": "ci"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_my_store.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    sections = re.split(r"^_{3,} (\w+)\.runTest _{3,}$", done.stdout, flags=re.MULTILINE)
    found = dict(zip(sections[1::2], sections[2::2], strict=True))
    assert set(found) == set(EXPECTED), done.stdout
    last = list(found)[-1]  # the summary after the last section is not part of any report
    found[last] = found[last].split("= short test summary info =")[0]
    return found


@pytest.mark.parametrize("test_class", sorted(EXPECTED))
def test_a_broken_store_is_reported_on_one_screen_by_the_invariant_that_names_it(
    reports: dict[str, str], test_class: str
) -> None:
    report = reports[test_class]
    invariant, culprit, logged = EXPECTED[test_class]
    violation = re.search(r"^E\s+featurestream\.testing\.invariants\.InvariantViolation: (\w+): (.*)$", report, re.M)
    assert violation is not None, report
    assert violation.group(1) == invariant, report
    assert re.search(culprit, violation.group(2)), violation.group(2)
    assert re.search(r"'s\d'", violation.group(2)), "the message names the sample"
    steps = re.findall(r"^E\s+(?:\w+ = )?state\.(\w+)\(", report, re.M)
    assert steps and steps[-1] == "teardown", report
    assert not [step for step in steps if step.startswith("inv")], "the shrunk steps list rules only"
    prose = "\n".join(line for line in report.splitlines() if not re.match(r"^E\s+(?:\w+ = )?state\.", line))
    assert "injected fault" not in prose and "stale" not in prose, "the kit's own faults stay out"
    records = re.findall(r"^(?:WARNING|ERROR) ", report, re.M)
    assert len(records) == logged and ("Captured log" in report) == bool(logged), report
    assert len(report.strip().splitlines()) < SCREEN_LINES, report


def test_the_kits_own_injections_and_repeats_are_dropped_from_the_logs(caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("featurestream.backends.memory.queue")
    fault = InjectedFault(errno.EIO, "injected fault: store scrub('s0') failed")
    quiet_injected_faults(True)
    try:
        with caplog.at_level(logging.WARNING):
            logger.warning("store %s(%r) raised %r; the queue carries on", "scrub", "s0", fault, exc_info=fault)
            try:
                raise InjectedCallbackError("a callback that raises")
            except InjectedCallbackError:
                logger.exception("queue callback raised; the queue carries on")
            try:
                try:
                    raise fault
                except InjectedFault:
                    raise TypeError("the queue's own bug while handling the fault") from None
            except TypeError as bug:
                logger.warning("kept: %r", bug, exc_info=bug)
            for sample in ("s0", "s1"):  # the user's own store error: logged once, not once per example
                logger.warning("kept: store scrub(%r) raised %r", sample, OSError(errno.EIO, "a real disk error"))
            logger.warning(StaleLog.MESSAGE, "ack", 7, "s0", "it was settled or reclaimed already")
    finally:
        quiet_injected_faults(False)
    assert [record.getMessage() for record in caplog.records] == [
        'kept: TypeError("the queue\'s own bug while handling the fault")',
        "kept: store scrub('s0') raised OSError(5, 'a real disk error')",
    ]
    with caplog.at_level(logging.WARNING):  # another test may have raised the root logger's level
        logger.warning("after the machine: %r", fault)
    assert caplog.records[-1].getMessage().startswith("after the machine"), "the filter is gone with the machine"
