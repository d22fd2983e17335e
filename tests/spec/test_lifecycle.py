"""The sample-lifecycle table (featurestream.spec.lifecycle.SAMPLE) is the spec's: same edges, same states."""

from __future__ import annotations

from collections import deque

import pytest

from featurestream.spec.lifecycle import RESIDENCY, SAMPLE, sample_state
from featurestream.spec.mirror import constants_from_config, initial_state, labelled_successors
from featurestream.spec.tlc import spec_dir

pytestmark = pytest.mark.timeout(300)


def _mirror_graph() -> tuple[set[str], set[tuple[str, str, str]]]:
    """Every sample state and every (spec action, source, dest) edge of the mirror's reachable graphs.

    The CI model, the dedup-window model (which adds eviction and re-store) and the dead-letter repair model
    (kept dead letters, requeue, purge).
    """
    states: set[str] = set()
    edges: set[tuple[str, str, str]] = set()
    for config in ("LeaseQueue.cfg", "LeaseQueueWindow.cfg", "LeaseQueueKeep.cfg"):
        constants = constants_from_config((spec_dir() / config).read_text())
        samples = range(len(constants.samples))
        start = initial_state(constants)
        seen = {start}
        frontier = deque([start])
        while frontier:
            state = frontier.popleft()
            states.update(sample_state(state, s) for s in samples)
            for action, step in labelled_successors(constants, state):
                if step is None:
                    continue
                for s in samples:
                    before, after = sample_state(state, s), sample_state(step.state, s)
                    if before != after:
                        edges.add((action, before, after))
                if step.state not in seen:
                    seen.add(step.state)
                    frontier.append(step.state)
    return states, edges


@pytest.fixture(scope="module")
def mirror_graph() -> tuple[set[str], set[tuple[str, str, str]]]:
    return _mirror_graph()


def test_every_table_edge_is_a_mirror_edge_and_back(mirror_graph: tuple[set[str], set[tuple[str, str, str]]]) -> None:
    _, edges = mirror_graph
    table = {(t.spec_action, t.source, t.dest) for t in SAMPLE.transitions}
    assert table - edges == set(), "edges in the table the spec never takes"
    assert edges - table == set(), "edges the spec takes that the table is missing"


def test_table_states_are_the_reachable_sample_states(mirror_graph: tuple[set[str], set[tuple[str, str, str]]]) -> None:
    states, _ = mirror_graph
    assert set(SAMPLE.states) == states
    assert set(RESIDENCY) == set(SAMPLE.states)
    assert SAMPLE.initial == "absent" and set(SAMPLE.terminal) <= set(SAMPLE.states)


def test_table_is_well_formed() -> None:
    keys = [(t.trigger, t.source, t.dest) for t in SAMPLE.transitions]
    assert len(keys) == len(set(keys)), "duplicate transitions"
    for t in SAMPLE.transitions:
        assert t.source in SAMPLE.states and t.dest in SAMPLE.states
        assert t.trigger.isidentifier() and t.method and t.guard
    outgoing = {t.source for t in SAMPLE.transitions}
    assert {"absent", "stored", "paused", "pending", "leased"} <= outgoing
    assert "discarded" not in outgoing, "a discarded sample is gone for good"
