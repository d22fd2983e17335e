"""The real TLC on spec/LeaseQueue.tla, deadlock checking on, as a reviewer runs it.

Every shipped exhaustive config is clean and pinned, and the Python mirror reaches
exactly the same states; the simulation model runs clean under a depth and time
bound; every mutant (defects A-E, the old backpressure rule, the old scrub-fault
behaviour) yields its counterexample.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from featurestream.core.machines import LEASE
from featurestream.spec.mirror import LEASE_STATES, LEASE_TRANSITIONS, constants_from_config, reachable_states
from featurestream.spec.tlc import Simulation, parse_output, run_tlc, spec_dir

from .tlc_runs import tlc

pytestmark = pytest.mark.timeout(900)

LIVENESS = ("EventuallySettled", "ProducerProgress", "EventuallyDrained", "DrainAfterFaults")


def _assert_clean(result_ok: bool, output: str, command: tuple[str, ...]) -> None:
    assert "-deadlock" not in command, "TLC must run with deadlock checking on"
    assert result_ok, output[-4000:]


def test_ci_model_has_no_error_and_the_pinned_state_count(tlc_available: None, ci_distinct_states: int) -> None:
    result = tlc(spec_dir() / "LeaseQueue.cfg", workers=1, timeout=600)
    print(result.summary())
    _assert_clean(result.ok, result.output, result.command)
    assert "temporal properties for the complete state space" in result.output, (
        "the liveness properties must be checked"
    )
    assert result.distinct_states == ci_distinct_states, (
        f"TLC found {result.distinct_states} distinct states, pinned {ci_distinct_states}: "
        "if the spec changed on purpose, update CI_DISTINCT_STATES (and the mirror must follow)"
    )


@pytest.mark.parametrize(
    "config",
    [
        "LeaseQueueWindow.cfg",
        "LeaseQueueKeep.cfg",
        "LeaseQueueCount.cfg",
        "LeaseQueueLost.cfg",
        "LeaseQueueGiveBack.cfg",
    ],
)
def test_small_model_has_no_error_and_the_pinned_state_count(
    tlc_available: None, pinned_states: dict[str, int], config: str
) -> None:
    result = tlc(spec_dir() / config, workers=1, timeout=600)
    print(result.summary())
    _assert_clean(result.ok, result.output, result.command)
    assert "temporal properties for the complete state space" in result.output
    assert result.distinct_states == pinned_states[config]


@pytest.mark.parametrize(
    "config",
    [
        "LeaseQueue.cfg",
        "LeaseQueueWindow.cfg",
        "LeaseQueueKeep.cfg",
        "LeaseQueueCount.cfg",
        "LeaseQueueLost.cfg",
        "LeaseQueueGiveBack.cfg",
    ],
)
def test_mirror_reaches_exactly_the_states_tlc_explores(config: str, pinned_states: dict[str, int]) -> None:
    expected = pinned_states[config]
    constants = constants_from_config((spec_dir() / config).read_text())
    count = reachable_states(constants, limit=2 * expected, check=True)
    print(f"mirror on {config}: {count} reachable states, every invariant and action property holds, no deadlock")
    assert count == expected


def test_window_model_evicts_and_stores_a_forgotten_id_anew() -> None:
    """The dedup-window config really reaches an eviction and a new incarnation of the evicted id."""
    from featurestream.spec.mirror import initial_state, successors

    constants = constants_from_config((spec_dir() / "LeaseQueueWindow.cfg").read_text())
    assert constants.window == 1 < len(constants.samples)
    seen = {initial_state(constants)}
    frontier = list(seen)
    reborn = False
    while frontier and not reborn:
        state = frontier.pop()
        for nxt in successors(constants, state):
            pairs = zip(state.status, nxt.status, strict=True)
            reborn |= any(a in ("acked", "dead") and b == "stored" for a, b in pairs)
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert reborn


def test_window_model_rejects_an_untrainable_sample_with_deliveries_left() -> None:
    """The window config really reaches a reject: the untrainable sample's live lease is dead-lettered at its
    first delivery, where a fail would redeliver it; no step acks it."""
    from featurestream.spec.mirror import initial_state, labelled_successors

    constants = constants_from_config((spec_dir() / "LeaseQueueWindow.cfg").read_text())
    (bad,) = (constants.samples.index(s) for s in constants.untrainable)
    assert constants.max_deliveries > 1 and not constants.bugs
    start = initial_state(constants)
    seen, frontier, rejected_early = {start}, [start], False
    while frontier:
        state = frontier.pop()
        for name, step in labelled_successors(constants, state):
            if step is None:
                continue
            assert name != "Ack" or step.state.status[bad] != "acked"
            if name == "Reject" and state.status[bad] == "leased":
                assert step.state.status[bad] == "dead"
                rejected_early |= state.deliveries[bad] + 1 < constants.max_deliveries
            if step.state not in seen:
                seen.add(step.state)
                frontier.append(step.state)
    assert rejected_early


def test_count_model_pauses_a_producer_at_the_sample_cap_and_resumes_it() -> None:
    """In the sample-count cap config only the count pauses (bytes stay below the high watermark): a producer
    really waits paused at the cap while the queue holds a sample, and is resumed once a slot is free."""
    from featurestream.spec.mirror import initial_state, labelled_successors

    constants = constants_from_config((spec_dir() / "LeaseQueueCount.cfg").read_text())
    assert constants.max_samples == 2 and not constants.bugs
    assert sum(constants.sizes()) < constants.high_watermark  # bytes alone never pause here
    start = initial_state(constants)
    seen, frontier, waited, resumed = {start}, [start], False, False
    while frontier:
        state = frontier.pop()
        waited |= (
            state.backpressure == "paused"
            and len(state.resident) == constants.max_samples
            and "waiting" in state.pc
            and any(status in ("pending", "leased") for status in state.status)
        )
        for name, step in labelled_successors(constants, state):
            if step is None:
                continue
            if name == "PauseP":
                assert len(state.resident) == constants.max_samples, "a pause below the count cap"
            resumed |= name == "ResumeP"
            if step.state not in seen:
                seen.add(step.state)
                frontier.append(step.state)
    assert waited and resumed


def test_keep_model_requeues_and_purges_kept_dead_letters() -> None:
    """The dead-letter repair config really requeues a kept dead letter, purges one, and fails a purge's scrub."""
    from featurestream.spec.mirror import initial_state, labelled_successors

    constants = constants_from_config((spec_dir() / "LeaseQueueKeep.cfg").read_text())
    assert constants.keep_dead and not constants.bugs
    start = initial_state(constants)
    seen, frontier, taken = {start}, [start], set()
    while frontier:
        state = frontier.pop()
        for name, step in labelled_successors(constants, state):
            if step is None:
                continue
            if name == "RequeueDeadLetter":
                assert [state.status[s] for s in state.kept - step.state.kept] == ["dead"]
            if name == "PurgeDeadLetter":
                taken.add(("PurgeDeadLetter", any(event[0] == "StoreFault" for event in step.events)))
            taken.add((name, False))
            if step.state not in seen:
                seen.add(step.state)
                frontier.append(step.state)
    assert {("RequeueDeadLetter", False), ("PurgeDeadLetter", False), ("PurgeDeadLetter", True)} <= taken
    assert ("Reject", False) in taken  # an untrainable sample's bytes are kept, so it may be requeued


def test_every_shipped_config_is_checked_by_a_test() -> None:
    shipped = sorted(p.name for p in spec_dir().glob("*.cfg"))
    assert shipped == [
        "BufferReuse.cfg",  # tests/spec/test_buffer_reuse_spec.py
        "Incarnation.cfg",  # tests/spec/test_incarnation_spec.py
        "LeaseQueue.cfg",
        "LeaseQueueCount.cfg",
        "LeaseQueueDeep.cfg",
        "LeaseQueueGiveBack.cfg",
        "LeaseQueueKeep.cfg",
        "LeaseQueueLost.cfg",
        "LeaseQueueSim.cfg",
        "LeaseQueueWindow.cfg",
        "OrphanReclaim.cfg",  # tests/spec/test_orphan_spec.py
        "ReplicatedQueue.cfg",  # tests/spec/test_replicated_spec.py
        "Resume.cfg",  # tests/spec/test_resume_spec.py
    ]
    for name in shipped:
        text = (spec_dir() / name).read_text()
        for switch in re.findall(r"^\s+(Bug\w+) = (\w+)", text, re.M):
            assert switch[1] == "FALSE", f"{name} ships with {switch[0]} on"


def test_simulation_of_the_large_model_finds_no_error(tlc_available: None) -> None:
    """`-simulate -depth 100` on 4 samples, 3 producers, 3 consumers, 2 faults, a window of 2: ~1 minute."""
    seed = int(os.environ.get("FEATURESTREAM_TLC_SEED", "20261130"))
    simulation = Simulation(depth=100, seconds=90, seed=seed, traces=2000)
    result = tlc(spec_dir() / "LeaseQueueSim.cfg", workers=1, timeout=200, simulate=simulation)
    print(f"seed {seed}: {result.summary()}")
    _assert_clean(result.ok, result.output, result.command)
    assert "Running Random Simulation" in result.output
    assert "-depth" in result.command and "100" in result.command
    if result.states_generated is not None:  # absent only when the wall-time bound stopped TLC first
        assert result.states_generated > 10_000


@pytest.mark.parametrize(
    ("bug", "violated"),
    [
        ("A", "NoLoss"),
        ("B", "NoLeak"),
        ("C", "ExactlyOnce"),
        ("D", "BoundedDelivery"),
        ("E", "<deadlock>"),
        ("ProducerBytesCounted", "ProducerProgress"),
        ("ScrubFailUnsettles", "ExactlyOnce"),
        ("RequeueAnySettled", "ExactlyOnce"),
        ("OnlyBytes", "SampleCapRoom"),
        ("LostRedelivered", "LostReported"),
        ("UntrainedAcked", "AckedWasTrained"),
    ],
)
def test_each_defect_switch_yields_a_counterexample(tlc_available: None, bug: str, violated: str) -> None:
    result = tlc(spec_dir() / "mutants" / f"Bug{bug}.cfg", workers=1, timeout=300)
    print(f"Bug{bug}: {result.summary()}")
    assert "-deadlock" not in result.command
    assert not result.ok
    assert result.violated == violated, result.output[-4000:]
    assert "State 1: <Initial predicate>" in result.output, "TLC must print the counterexample behaviour"


def test_defect_e_is_also_a_liveness_counterexample(tlc_available: None) -> None:
    """With deadlock checking off, the stuck lease of defect E shows as EventuallySettled failing."""
    result = tlc(spec_dir() / "mutants" / "BugE.cfg", workers=1, timeout=300, check_deadlock=False)
    print(f"BugE without deadlock checking: {result.summary()}")
    assert "-deadlock" in result.command
    assert result.violated == "EventuallySettled", result.output[-4000:]


def test_the_old_backpressure_rule_strands_both_producers_with_nothing_queued(tlc_available: None) -> None:
    """Issue 9's scenario: both producers stored a sample and wait paused while nothing is pending or leased."""
    result = tlc(spec_dir() / "mutants" / "BugProducerBytesCounted.cfg", workers=1, timeout=300)
    assert result.violated == "ProducerProgress"
    states = [block for block in result.output.split("\nState ") if "/\\ bp = " in block]
    last = states[-1]  # the state the behaviour stutters in (or loops back to) for ever
    assert '/\\ bp = "paused"' in last
    assert '/\\ pc = (p1 :> "waiting" @@ p2 :> "waiting")' in last
    assert "/\\ queue = <<>>" in last


def test_producer_progress_needs_strong_fairness_on_the_enqueue(tlc_available: None, tmp_path: Path) -> None:
    """Weak fairness on Enqueue starves a producer; the same model under FairSpec (strong) is clean."""
    weak_config = spec_dir() / "mutants" / "WeakEnqueueFairness.cfg"
    weak = tlc(weak_config, workers=1, timeout=300)  # one worker, as the CLI test of this mutant runs it
    print(f"WeakFairSpec: {weak.summary()}")
    assert weak.violated == "ProducerProgress", weak.output[-4000:]
    assert "Back to state" in weak.output, "the counterexample is a cycle in which the producer keeps waiting"
    strong_config = tmp_path / "StrongEnqueueFairness.cfg"
    strong_config.write_text(weak_config.read_text().replace("SPECIFICATION WeakFairSpec", "SPECIFICATION FairSpec"))
    strong = tlc(strong_config, workers=1, timeout=300)
    print(f"FairSpec: {strong.summary()}")
    _assert_clean(strong.ok, strong.output, strong.command)


@pytest.mark.parametrize(
    ("bug", "violated"),
    [
        ("A", "NoLoss"),
        ("B", "NoLeak"),
        ("C", "ExactlyOnce"),
        ("D", "BoundedDelivery"),
        ("E", "Deadlock"),
        ("ProducerBytesCounted", None),
        ("ScrubFailUnsettles", "NoLeak"),
        ("RequeueAnySettled", "ExactlyOnce"),
        ("OnlyBytes", "SampleCapRoom"),
        ("LostRedelivered", "LostReported"),
        ("UntrainedAcked", "AckedWasTrained"),
    ],
)
def test_the_mirror_finds_the_same_safety_violations(bug: str, violated: str | None) -> None:
    constants = constants_from_config((spec_dir() / "mutants" / f"Bug{bug}.cfg").read_text())
    assert constants.bugs == {bug if len(bug) == 1 else bug[0]}
    if violated is None:  # breaks only liveness, which only TLC checks
        assert reachable_states(constants, limit=100_000, check=True) > 10
        return
    with pytest.raises(AssertionError, match=rf"^{violated}:"):
        reachable_states(constants, limit=100_000, check=True)


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
    names = [
        "OneLiveLease",
        "ExactlyOnce",
        "SettledForGood",
        "SettledKnown",
        "StaleAckRejection",
        "LeaseStepsFollowMachine",
        "NoLoss",
        "NoLeak",
        "ResidencyExact",
        "ResidencyBound",
        "SampleCapRoom",
        "BoundedDelivery",
        "Hysteresis",
        "CloseDrain",
        "ClosedRefusesPuts",
        *LIVENESS,
    ]
    configs = (
        "LeaseQueue.cfg",
        "LeaseQueueWindow.cfg",
        "LeaseQueueKeep.cfg",
        "LeaseQueueCount.cfg",
        "LeaseQueueDeep.cfg",
    )
    for config_name in configs:
        config = (spec_dir() / config_name).read_text()
        for name in names:
            assert re.search(rf"^{name} ==", spec, re.M), f"{name} is not defined in LeaseQueue.tla"
            assert re.search(rf"^\s+{name}\s*$", config, re.M), f"{name} is not checked by {config_name}"
        assert "SPECIFICATION FairSpec" in config
    # 16 needs a sample no consumer can train: the window and keep models have one (the others none).
    assert re.search(r"^AckedWasTrained ==", spec, re.M)
    for config_name in ("LeaseQueueWindow.cfg", "LeaseQueueKeep.cfg"):
        config = (spec_dir() / config_name).read_text()
        assert re.search(r"^\s+AckedWasTrained\s*$", config, re.M), config_name
        assert re.search(r"^\s+Untrainable = \{s\d\}\s*$", config, re.M), config_name
    assert "SF_vars(Enqueue(p))" in spec, "ProducerProgress rests on strong fairness of the enqueue"
    assert re.search(r"^Done == ", spec, re.M)


def test_no_doc_or_runner_turns_deadlock_checking_off() -> None:
    root = spec_dir()
    assert "-deadlock" not in (root / "README.md").read_text().replace("no `-deadlock`", "")
    for cfg in [*root.glob("*.cfg"), *root.glob("mutants/*.cfg")]:
        assert "-deadlock" not in cfg.read_text().replace("(-deadlock)", ""), cfg


_CLEAN = """Model checking completed. No error has been found.
173523 states generated, 27202 distinct states found, 0 states left on queue.
The depth of the complete state graph search is 23.
"""
_INVARIANT = """Error: Invariant NoLoss is violated.
Error: The behavior up to this point is:
State 1: <Initial predicate>
48 states generated, 32 distinct states found, 16 states left on queue.
"""
_TEMPORAL = """Error: Temporal properties were violated.
132 states generated, 54 distinct states found, 0 states left on queue.
"""
_SIMULATION = """Running Random Simulation with seed 7 with 1 worker on 2 cores.
Computed 1 initial states...
Progress: 50505 states checked.
Finished in 10s at (2026-11-30 21:20:59)
"""


def test_parse_output_reads_counts_and_verdicts() -> None:
    clean = parse_output(_CLEAN, 0, 1.0)
    assert (clean.ok, clean.distinct_states, clean.states_generated, clean.depth) == (True, 27202, 173523, 23)
    broken = parse_output(_INVARIANT, 12, 1.0)
    assert (broken.ok, broken.violated, broken.distinct_states) == (False, "NoLoss", 32)
    action = parse_output("Error: Action property ExactlyOnce is violated.\n", 13, 1.0)
    assert action.violated == "ExactlyOnce"
    single = parse_output(_TEMPORAL, 13, 1.0, "PROPERTIES\n    EventuallySettled\n")
    assert single.violated == "EventuallySettled"
    several = parse_output(_TEMPORAL, 13, 1.0, "PROPERTIES\n    ExactlyOnce\n    EventuallySettled\n")
    assert several.violated == "<temporal>"
    assert not parse_output("No error has been found.\nError: boom\n", 0, 1.0).ok
    deadlock = parse_output("Error: Deadlock reached.\n", 11, 1.0)
    assert (deadlock.ok, deadlock.violated) == (False, "<deadlock>")
    simulated = parse_output(_SIMULATION, 0, 10.0, simulated=True)
    assert (simulated.ok, simulated.states_generated) == (True, 50505)
    assert not parse_output(_SIMULATION, 0, 10.0).ok, "a simulation's output is no exhaustive verdict"
    assert not parse_output(_SIMULATION + "Error: Invariant NoLoss is violated.\n", 12, 10.0, simulated=True).ok


def test_simulation_arguments() -> None:
    assert Simulation(depth=50, seed=3, traces=10).arguments() == ["-simulate", "num=10", "-depth", "50", "-seed", "3"]
    assert Simulation(traces=None).arguments() == ["-simulate", "-depth", "100"]


def test_run_tlc_refuses_a_missing_config(tlc_available: None) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.cfg"):
        run_tlc("nope.cfg")


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_deep_model_has_no_error(tlc_available: None, pinned_states: dict[str, int]) -> None:
    """Nightly only: the CI model with two consumers, every property including liveness."""
    result = tlc(spec_dir() / "LeaseQueueDeep.cfg", workers=2, timeout=None)
    print(result.summary())
    _assert_clean(result.ok, result.output, result.command)
    assert result.distinct_states == pinned_states["LeaseQueueDeep.cfg"]


def test_check_command_reports_a_violation_and_a_missing_config(
    tlc_available: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from featurestream.cli import main

    assert main(["check", "--config", str(spec_dir() / "mutants" / "BugC.cfg"), "--workers", "1"]) == 1
    assert "TLC: VIOLATED ExactlyOnce" in capsys.readouterr().out
    assert main(["check", "--config", "missing.cfg"]) == 2
    assert "missing.cfg" in capsys.readouterr().out
