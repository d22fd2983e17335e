"""The real TLC on spec/LeaseQueue.tla: the CI model is clean, pinned, equal to the mirror; mutants A-E fail."""

from __future__ import annotations

import re

import pytest

from featurestream.machines import LEASE
from featurestream.spec.mirror import LEASE_STATES, LEASE_TRANSITIONS, constants_from_config, reachable_states
from featurestream.spec.tlc import parse_output, run_tlc, spec_dir

pytestmark = pytest.mark.timeout(900)


def test_ci_model_has_no_error_and_the_pinned_state_count(tlc_available: None, ci_distinct_states: int) -> None:
    result = run_tlc(spec_dir() / "LeaseQueue.cfg", workers=2, timeout=600)
    print(result.summary())
    assert result.ok, result.output[-4000:]
    assert "Checking 2 branches of temporal properties for the complete state space" in result.output, (
        "the liveness property EventuallySettled must be checked"
    )
    assert result.distinct_states == ci_distinct_states, (
        f"TLC found {result.distinct_states} distinct states, pinned {ci_distinct_states}: "
        "if the spec changed on purpose, update CI_DISTINCT_STATES (and the mirror must follow)"
    )


def test_mirror_reaches_exactly_the_states_tlc_explores(ci_distinct_states: int) -> None:
    constants = constants_from_config((spec_dir() / "LeaseQueue.cfg").read_text())
    count = reachable_states(constants, limit=2 * ci_distinct_states, check=True)
    print(f"mirror: {count} reachable states, every invariant and action property holds")
    assert count == ci_distinct_states


@pytest.mark.parametrize(
    ("bug", "violated"),
    [
        ("A", "NoLoss"),
        ("B", "NoLeak"),
        ("C", "ExactlyOnce"),
        ("D", "BoundedDelivery"),
        ("E", "EventuallySettled"),
    ],
)
def test_each_defect_switch_yields_a_counterexample(tlc_available: None, bug: str, violated: str) -> None:
    result = run_tlc(spec_dir() / "mutants" / f"Bug{bug}.cfg", workers=1, timeout=300)
    print(f"Bug{bug}: {result.summary()}")
    assert not result.ok
    assert result.violated == violated, result.output[-4000:]
    assert "State 1: <Initial predicate>" in result.output, "TLC must print the counterexample behaviour"


@pytest.mark.parametrize(
    ("bug", "violated"),
    [("A", "NoLoss"), ("B", "NoLeak"), ("C", "ExactlyOnce"), ("D", "BoundedDelivery"), ("E", None)],
)
def test_the_mirror_finds_the_same_safety_violations(bug: str, violated: str | None) -> None:
    constants = constants_from_config((spec_dir() / "mutants" / f"Bug{bug}.cfg").read_text())
    assert constants.bugs == {bug}
    if violated is None:  # E breaks only liveness, which only TLC checks
        assert reachable_states(constants, limit=10_000, check=True) > 10
        return
    with pytest.raises(AssertionError, match=rf"^{violated}:"):
        reachable_states(constants, limit=10_000, check=True)


def _definition(name: str) -> str:
    text = (spec_dir() / "LeaseQueue.tla").read_text()
    lines = [line for line in text.splitlines() if line.startswith(f"{name} == ")]
    assert len(lines) == 1, f"{name} must be defined on exactly one line"
    return lines[0]


def test_spec_lease_machine_matches_mirror_and_machines_table() -> None:
    states = set(re.findall(r'"(\w+)"', _definition("LeaseStates")))
    transitions = set(re.findall(r'<<"(\w+)", "(\w+)", "(\w+)">>', _definition("LeaseTransitions")))
    assert states == set(LEASE_STATES) == set(LEASE.states)
    assert transitions == set(LEASE_TRANSITIONS)
    assert transitions == {(t.spec_action, t.source, t.dest) for t in LEASE.transitions}


def test_every_design_invariant_is_named_in_the_spec_and_checked_in_ci() -> None:
    spec = (spec_dir() / "LeaseQueue.tla").read_text()
    config = (spec_dir() / "LeaseQueue.cfg").read_text()
    names = [
        "OneLiveLease",
        "ExactlyOnce",
        "StaleAckRejection",
        "LeaseStepsFollowMachine",
        "NoLoss",
        "NoLeak",
        "ResidencyExact",
        "BoundedDelivery",
        "Hysteresis",
        "CloseDrain",
        "ClosedRefusesPuts",
        "EventuallySettled",
    ]
    for name in names:
        assert re.search(rf"^{name} ==", spec, re.M), f"{name} is not defined in LeaseQueue.tla"
        assert re.search(rf"^\s+{name}\s*$", config, re.M), f"{name} is not checked by LeaseQueue.cfg"
    assert "SPECIFICATION FairSpec" in config


_CLEAN = """Model checking completed. No error has been found.
610563 states generated, 68023 distinct states found, 0 states left on queue.
The depth of the complete state graph search is 24.
"""
_INVARIANT = """Error: Invariant NoLoss is violated.
Error: The behavior up to this point is:
State 1: <Initial predicate>
48 states generated, 32 distinct states found, 16 states left on queue.
"""
_TEMPORAL = """Error: Temporal properties were violated.
132 states generated, 54 distinct states found, 0 states left on queue.
"""


def test_parse_output_reads_counts_and_verdicts() -> None:
    clean = parse_output(_CLEAN, 0, 1.0)
    assert (clean.ok, clean.distinct_states, clean.states_generated, clean.depth) == (True, 68023, 610563, 24)
    broken = parse_output(_INVARIANT, 12, 1.0)
    assert (broken.ok, broken.violated, broken.distinct_states) == (False, "NoLoss", 32)
    action = parse_output("Error: Action property ExactlyOnce is violated.\n", 13, 1.0)
    assert action.violated == "ExactlyOnce"
    single = parse_output(_TEMPORAL, 13, 1.0, "PROPERTIES\n    EventuallySettled\n")
    assert single.violated == "EventuallySettled"
    several = parse_output(_TEMPORAL, 13, 1.0, "PROPERTIES\n    ExactlyOnce\n    EventuallySettled\n")
    assert several.violated == "<temporal>"
    assert not parse_output("No error has been found.\nError: boom\n", 0, 1.0).ok


def test_run_tlc_refuses_a_missing_config(tlc_available: None) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.cfg"):
        run_tlc("nope.cfg")


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_deep_model_has_no_error(tlc_available: None) -> None:
    """Nightly only (about 20 minutes): three samples, safety."""
    result = run_tlc(spec_dir() / "LeaseQueueDeep.cfg", workers=2, timeout=None)
    print(result.summary())
    assert result.ok, result.output[-4000:]
    assert result.distinct_states == 5_608_789


def test_check_command_reports_a_violation_and_a_missing_config(
    tlc_available: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from featurestream.cli import main

    assert main(["check", "--config", str(spec_dir() / "mutants" / "BugC.cfg"), "--workers", "1"]) == 1
    assert "TLC: VIOLATED ExactlyOnce" in capsys.readouterr().out
    assert main(["check", "--config", "missing.cfg"]) == 2
    assert "missing.cfg" in capsys.readouterr().out
