"""The resume state machine (``spec/Resume.tla``'s actions) on the in-process queue, and its teeth."""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings

from featurestream import SampleRefQueue, VisibilityTimeout
from featurestream.core import resume as resume_core
from featurestream.testing.resume_machine import make_resume_machine

Machine = make_resume_machine(lambda store, clock: SampleRefQueue(store, VisibilityTimeout(5.0), clock=clock))
TestResumeMachine = Machine.TestCase
TestResumeMachine.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)


def test_the_machine_catches_a_ledger_that_admits_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resume_core.MemoryLedger, "admit", lambda self, samples: [True] * len(samples))
    with pytest.raises(AssertionError, match=r"trained twice|not every prompt once"):
        _run_to_failure()


def test_the_machine_catches_a_restore_that_rolls_nothing_back(monkeypatch: pytest.MonkeyPatch) -> None:
    real = resume_core.MemoryLedger.restore
    monkeypatch.setattr(resume_core.MemoryLedger, "restore", lambda self, rank, step: real(self, rank, 10**9))
    with pytest.raises(AssertionError, match=r"not every prompt once|ledger"):
        _run_to_failure()


def _run_to_failure() -> None:
    case = make_resume_machine(lambda store, clock: SampleRefQueue(store, VisibilityTimeout(5.0), clock=clock)).TestCase
    case.settings = settings(
        max_examples=300,
        stateful_step_count=40,
        deadline=None,
        database=None,
        report_multiple_bugs=False,
        phases=[Phase.generate],  # the counterexample, not its shrinking, is what these tests need
    )
    case("runTest").runTest()
