"""The real TLC on spec/ReplicatedQueue.tla (a replicated queue across primary crashes and failovers), deadlock
checking on.

The shipped model is clean with its state count pinned; the mutant that returns a call once the primary applied
it (before the replica has it) loses a returned put, and, checked for training alone, trains a sample twice.
"""

from __future__ import annotations

import re

import pytest

from featurestream.spec.tlc import TLCResult, spec_dir

from .tlc_runs import tlc

pytestmark = pytest.mark.timeout(600)

REPLICATED_DISTINCT_STATES = 5_438  # spec/ReplicatedQueue.cfg


def _run(config: str) -> TLCResult:
    module = spec_dir() / "ReplicatedQueue.tla"
    return tlc(spec_dir() / config, modules=[module], main_module="ReplicatedQueue.tla", check_deadlock=True, workers=1)


def test_the_replicated_model_has_no_error_and_the_pinned_state_count(tlc_available: None) -> None:
    result = _run("ReplicatedQueue.cfg")
    print(result.summary())
    assert "-deadlock" not in result.command
    assert result.ok, result.output[-4000:]
    assert result.distinct_states == REPLICATED_DISTINCT_STATES


@pytest.mark.parametrize(
    ("mutant", "violated", "steps"),
    [
        # A put returns before the replica has it; the primary is lost; the promoted replica has no such sample.
        ("ReplicatedAckEarly", "ToldNeverLost", ("PutReturns", "Failover")),
        # A commit and an ack return unreplicated; after the failover the ledger says untrained: trained twice.
        ("ReplicatedAckEarlyTraining", "TrainedAtMostOnce", ("CommitReturns", "Failover", "Train")),
    ],
)
def test_acknowledging_before_replication_is_refuted(
    tlc_available: None, mutant: str, violated: str, steps: tuple[str, ...]
) -> None:
    config = spec_dir() / "mutants" / f"{mutant}.cfg"
    assert "EarlyReturn = {" in config.read_text()
    result = _run(f"mutants/{mutant}.cfg")
    print(f"{mutant}: {result.summary()}")
    assert "-deadlock" not in result.command
    assert not result.ok
    assert result.violated == violated, result.output[-4000:]
    actions = re.findall(r"^State \d+: <(\w+)", result.output, flags=re.MULTILINE)
    assert actions[0] == "Initial" and actions[-1] == steps[-1], actions
    positions = [actions.index(step) for step in steps[:-1]]
    assert positions == sorted(positions), actions


def test_check_command_runs_the_replicated_model(tlc_available: None, capsys: pytest.CaptureFixture[str]) -> None:
    from featurestream.cli import main

    mutant = spec_dir() / "mutants" / "ReplicatedAckEarly.cfg"
    assert main(["check", "--config", str(mutant), "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "ReplicatedQueue.tla with" in out and "TLC: VIOLATED ToldNeverLost" in out
