"""The real TLC on spec/OrphanReclaim.tla (a producer that crashes between its store and queue steps, or exits
cleanly; bytes lost under the queue; the queue closed and drained), deadlock checking on.

The shipped model is clean with its state count pinned; the mutant whose sweep never frees anything fails the
liveness ("every stored sample is eventually queued or freed"), the one that frees a dead writer's sample without
waiting out the grace period and the one that skips the grace period while the queue is still open fail the safety
("nothing queued or leased is ever freed by the reclaim"), and the one whose close frees queued samples fails
``QueuedResident`` ("a queued sample is resident unless its bytes were lost"); ``featurestream check`` runs them.
"""

from __future__ import annotations

import pytest

from featurestream.spec.tlc import TLCResult, spec_dir

from .tlc_runs import tlc

pytestmark = pytest.mark.timeout(600)

ORPHAN_DISTINCT_STATES = 9_658  # spec/OrphanReclaim.cfg
NEVER = "mutants/OrphanNeverReclaim.cfg"
EARLY = "mutants/OrphanReclaimWithoutGrace.cfg"
CLOSE = "mutants/OrphanCloseUnlinksQueued.cfg"
UNDRAINED = "mutants/OrphanSweepUndrained.cfg"


def _run(config: str) -> TLCResult:
    module = spec_dir() / "OrphanReclaim.tla"
    return tlc(spec_dir() / config, modules=[module], main_module="OrphanReclaim.tla", check_deadlock=True, workers=1)


def _actions(result: TLCResult) -> list[str]:
    """The action of each state of TLC's counterexample (``Initial`` first, ``Stuttering`` for a lasso's end)."""
    return [
        line.split("<", 1)[1].split(" ", 1)[0] if "<" in line else line.split(": ", 1)[1]
        for line in result.output.splitlines()
        if line.startswith("State ")
    ]


def test_the_orphan_model_has_no_error_and_the_pinned_state_count(tlc_available: None) -> None:
    result = _run("OrphanReclaim.cfg")
    print(result.summary())
    assert "-deadlock" not in result.command
    assert result.ok, result.output[-4000:]
    assert result.distinct_states == ORPHAN_DISTINCT_STATES
    shipped = (spec_dir() / "OrphanReclaim.cfg").read_text()
    assert all(name in shipped for name in ("EveryStoredQueuedOrFreed", "DrainedRunEmpties", "QueuedResident"))


def test_a_sweep_that_never_frees_leaves_a_killed_producers_bytes_for_ever(tlc_available: None) -> None:
    assert "BugNeverReclaim = TRUE" in (spec_dir() / NEVER).read_text()
    result = _run(NEVER)
    print(result.summary())
    assert "-deadlock" not in result.command
    assert not result.ok and result.violated == "EveryStoredQueuedOrFreed", result.output[-4000:]
    assert "Temporal properties were violated" in result.output
    # The producer stores and is killed (before its queue step, or before a purge's scrub reached it: TLC's
    # search order picks one), and the bytes stay for ever while the sweep finds nothing to free.
    actions = _actions(result)
    assert actions[:2] == ["Initial", "Store"] and "Crash" in actions, result.output[-4000:]
    assert actions[-1] == "Stuttering" or "Back to state" in result.output, result.output[-4000:]
    last_bytes = [line for line in result.output.splitlines() if line.startswith("/\\ bytes = ")][-1]
    assert last_bytes == "/\\ bytes = (s1 :> TRUE)", result.output[-4000:]


def test_a_reclaim_without_the_grace_period_frees_a_sample_its_in_flight_enqueue_queues(tlc_available: None) -> None:
    assert "BugReclaimWithoutGrace = TRUE" in (spec_dir() / EARLY).read_text()
    result = _run(EARLY)
    print(result.summary())
    assert "-deadlock" not in result.command
    assert not result.ok and result.violated == "ReclaimNeverFreesHeld", result.output[-4000:]
    # Retained and sent, the producer dies; the sweep frees at once and the enqueue lands on freed bytes.
    assert _actions(result) == ["Initial", "Store", "Retain", "Send", "Crash", "Observe", "Reclaim", "Land"], (
        result.output[-4000:]
    )


def test_a_close_that_frees_queued_samples_leaves_the_queue_holding_a_sample_without_bytes(
    tlc_available: None,
) -> None:
    assert "BugCloseUnlinksQueued = TRUE" in (spec_dir() / CLOSE).read_text()
    result = _run(CLOSE)
    print(result.summary())
    assert "-deadlock" not in result.command
    assert not result.ok and result.violated == "QueuedResident", result.output[-4000:]
    # The producer queues its sample and ends with queue.close(); store.close(): the close takes the queued bytes.
    assert _actions(result) == ["Initial", "Store", "Retain", "Send", "Land", "WriterClose"], result.output[-4000:]


def test_the_no_grace_sweep_of_an_open_queue_frees_a_sample_its_in_flight_enqueue_queues(tlc_available: None) -> None:
    assert "BugSweepUndrained = TRUE" in (spec_dir() / UNDRAINED).read_text()
    result = _run(UNDRAINED)
    print(result.summary())
    assert "-deadlock" not in result.command
    assert not result.ok and result.violated == "ReclaimNeverFreesHeld", result.output[-4000:]
    assert _actions(result) == ["Initial", "Store", "Retain", "Send", "Crash", "DrainSweep", "Land"], result.output[
        -4000:
    ]


def test_check_command_runs_the_orphan_model(tlc_available: None, capsys: pytest.CaptureFixture[str]) -> None:
    from featurestream.cli import main

    assert main(["check", "--config", "spec/OrphanReclaim.cfg", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "OrphanReclaim.tla with" in out and f"TLC: no error; {ORPHAN_DISTINCT_STATES} distinct states" in out
    assert main(["check", "--config", f"spec/{EARLY}", "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "TLC: VIOLATED ReclaimNeverFreesHeld" in out and "Reclaim" in out
    assert main(["check", "--config", f"spec/{NEVER}", "--workers", "1"]) == 1
    assert "TLC: VIOLATED EveryStoredQueuedOrFreed" in capsys.readouterr().out
    assert main(["check", "--config", f"spec/{CLOSE}", "--workers", "1"]) == 1
    assert "TLC: VIOLATED QueuedResident" in capsys.readouterr().out
