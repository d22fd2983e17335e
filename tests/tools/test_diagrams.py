"""The diagrams in ``diagrams/`` are drawn from the live machines, match the spec, and really render."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
import xml.etree.ElementTree as ET

import pytest
import torch

from featurestream import LocalFeatureStore, SampleRefQueue, VisibilityTimeout, render_queue
from featurestream.cli import main
from featurestream.core.machines import LEASE, MachineTable, build_machine
from featurestream.spec.lifecycle import RESIDENCY, SAMPLE
from featurestream.tools.diagrams import (
    FORMATS,
    LIVE_MACHINES,
    REFRESH_COMMAND,
    REVIEW_DIAGRAMS,
    SAMPLE_VIEWS,
    GraphvizMissing,
    machine_dot,
    render_source,
    write_diagrams,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
DIAGRAMS = ROOT / "diagrams"
SPEC = ROOT / "spec" / "LeaseQueue.tla"
SCREEN_PX = 2500  # the committed PNGs (144 dpi) must fit a review screen, scaled at most by half
NEEDS_DOT = "graphviz's `dot` binary is missing: install it (apt-get install graphviz / brew install graphviz)"


# -- (1) the committed diagrams are the live machines' -------------------------------------
def stale_diagrams(machines: tuple[tuple[MachineTable, object], ...], directory: pathlib.Path) -> list[str]:
    """Names of the committed DOT files that differ from a regeneration of ``machines``."""
    stale = []
    for table, machine in machines:
        committed = directory / f"{table.name}.dot"
        if not committed.exists() or committed.read_text() != machine_dot(table, machine):  # type: ignore[arg-type]
            stale.append(committed.name)
    return stale


def test_committed_dot_equals_the_live_machines() -> None:
    stale = stale_diagrams(REVIEW_DIAGRAMS, DIAGRAMS)
    assert not stale, (
        f"stale diagrams: diagrams/{', diagrams/'.join(stale)} differ from the live machines "
        "(featurestream.core.machines); "
        f"refresh them from the repository root with `{REFRESH_COMMAND}` "
        "(or `python -m featurestream diagrams --out diagrams`) and commit diagrams/"
    )
    for table, _ in REVIEW_DIAGRAMS:
        for fmt in ("svg", "png"):
            assert (DIAGRAMS / f"{table.name}.{fmt}").stat().st_size > 0, f"diagrams/{table.name}.{fmt} is empty"


def test_a_changed_transition_makes_the_committed_diagram_stale() -> None:
    # Seeded drift: redirect ack to `failed`, as an edit of machines.py would, without refreshing.
    changed = dataclasses.replace(
        LEASE,
        transitions=tuple(
            dataclasses.replace(t, dest="failed") if t.trigger == "ack" else t for t in LEASE.transitions
        ),
    )
    assert stale_diagrams(((changed, build_machine(changed)),), DIAGRAMS) == ["lease.dot"]


def test_dot_is_deterministic() -> None:
    table, machine = LIVE_MACHINES[0]
    first = machine_dot(table, machine)
    assert first == machine_dot(table, machine)
    assert not re.search(r"0x[0-9a-f]{6,}", first), "a memory address leaked into the DOT"


def test_edges_are_labelled_with_method_guard_and_spec_action() -> None:
    for table, machine in LIVE_MACHINES:
        source = machine_dot(table, machine)
        for t in table.transitions:
            edge = f'{t.source} -> {t.dest} [label="{t.trigger}: {t.method}\\n[{t.guard}]\\n(spec {t.spec_action})"]'
            assert edge in source, f"{table.name}: no edge {edge!r} in\n{source}"
        double = set(re.findall(r"^\t(\w+) \[.*peripheries=2", source, re.M))
        assert double == set(table.terminal), f"{table.name}: drawn terminal {double}, table says {table.terminal}"


def test_a_machine_edge_missing_from_the_table_is_refused() -> None:
    extra = dataclasses.replace(
        LEASE, transitions=(*LEASE.transitions, dataclasses.replace(LEASE.transitions[0], trigger="skip"))
    )
    with pytest.raises(LookupError, match=r"\('skip', 'pending', 'leased'\)"):
        machine_dot(LEASE, build_machine(extra))


# -- (2) the machines are the spec's ------------------------------------------------------
def spec_lease_definitions(text: str) -> tuple[set[str], set[tuple[str, str, str]]]:
    """``LeaseStates`` and ``LeaseTransitions`` (``<<action, source, dest>>`` tuples) from the spec text."""
    found = {}
    for name in ("LeaseStates", "LeaseTransitions"):
        match = re.search(rf"^{name}\s*==\s*\{{(.*?)\}}", text, re.M | re.S)
        if match is None:
            raise AssertionError(f"spec/LeaseQueue.tla has no `{name} == {{...}}` definition")
        found[name] = match.group(1)
    states = set(re.findall(r'"([^"]*)"', found["LeaseStates"]))
    tuple_re = r'<<\s*"([^"]*)"\s*,\s*"([^"]*)"\s*,\s*"([^"]*)"\s*>>'
    transitions = set(re.findall(tuple_re, found["LeaseTransitions"]))
    leftover = re.sub(tuple_re, "", found["LeaseTransitions"]).replace(",", "").strip()
    if leftover:
        raise AssertionError(
            f"LeaseTransitions holds something other than <<action, source, dest>> tuples: {leftover!r}"
        )
    return states, transitions


def lease_mismatches(table: MachineTable, states: set[str], transitions: set[tuple[str, str, str]]) -> list[str]:
    """How ``table`` differs from the spec's states and ``(action, source, dest)`` transitions; empty if equal."""
    ours = {(t.spec_action, t.source, t.dest) for t in table.transitions}
    problems = [f"state {s!r} only in the spec" for s in sorted(states - set(table.states))]
    problems += [f"state {s!r} only in the machine" for s in sorted(set(table.states) - states)]
    problems += [f"transition {t} only in the spec" for t in sorted(transitions - ours)]
    problems += [f"transition {t} only in the machine" for t in sorted(ours - transitions)]
    return problems


def test_lease_machine_equals_the_spec() -> None:
    if not SPEC.exists():
        pytest.fail(
            "spec/LeaseQueue.tla does not exist; it must define one-line `LeaseStates == {...}` and "
            '`LeaseTransitions == {<<"Acquire", "pending", "leased">>, ...}` for this check'
        )
    states, transitions = spec_lease_definitions(SPEC.read_text())
    assert lease_mismatches(LEASE, states, transitions) == []


def test_every_edge_names_an_action_the_spec_defines() -> None:
    # The edge labels and diagrams/README.md cite these names; a rename on either side must show.
    if not SPEC.exists():
        pytest.fail("spec/LeaseQueue.tla does not exist; the diagrams cite its actions")
    text = SPEC.read_text()
    missing = [
        f"{table.name}.{t.trigger} -> {t.spec_action}"
        for table, _ in REVIEW_DIAGRAMS
        for t in table.transitions
        if not re.search(rf"^{t.spec_action}(\(.*?\))?\s*==", text, re.M)
    ]
    assert missing == [], f"spec/LeaseQueue.tla defines no action for {missing}"


def test_spec_comparison_has_teeth() -> None:
    text = (
        'LeaseStates == {"pending", "leased", "acked", "failed", "reclaimed"}\n'
        "LeaseTransitions == {"
        + ", ".join(f'<<"{t.spec_action}", "{t.source}", "{t.dest}">>' for t in LEASE.transitions)
        + "}\n"
    )
    states, transitions = spec_lease_definitions(text)
    assert lease_mismatches(LEASE, states, transitions) == []
    dropped = dataclasses.replace(LEASE, transitions=LEASE.transitions[1:])
    assert lease_mismatches(dropped, states, transitions) == [
        "transition ('Acquire', 'pending', 'leased') only in the spec"
    ]
    redirected = dataclasses.replace(
        LEASE,
        transitions=tuple(
            dataclasses.replace(t, dest="acked") if t.spec_action == "Fail" else t for t in LEASE.transitions
        ),
    )
    assert lease_mismatches(redirected, states, transitions) == [
        "transition ('Fail', 'leased', 'failed') only in the spec",
        "transition ('Fail', 'leased', 'acked') only in the machine",
    ]
    extra_state = dataclasses.replace(LEASE, states=(*LEASE.states, "parked"))
    assert lease_mismatches(extra_state, states, transitions) == ["state 'parked' only in the machine"]
    with pytest.raises(AssertionError, match="LeaseTransitions"):
        spec_lease_definitions('LeaseStates == {"pending"}\n')


# -- (3) rendering and the CLI --------------------------------------------------------------
def svg_text(data: bytes) -> str:
    return " ".join(element.text or "" for element in ET.fromstring(data).iter() if element.tag.endswith("text"))


def test_rendering_produces_svg_and_png_with_every_state() -> None:
    if shutil.which("dot") is None:
        pytest.skip(NEEDS_DOT)
    for table, machine in REVIEW_DIAGRAMS:
        source = machine_dot(table, machine)
        text = svg_text(render_source(source, "svg"))
        for state in table.states:
            assert state in text.split(), f"{table.name}.svg lacks state {state!r}: {text}"
        for t in table.transitions:
            assert t.method in text, f"{table.name}.svg lacks method {t.method!r}"
        assert render_source(source, "png").startswith(b"\x89PNG\r\n\x1a\n")


def test_cli_writes_dot_without_the_binary(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["diagrams", "--out", str(tmp_path / "out"), "--format", "dot"]) == 0
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == [
        "backpressure.dot",
        "lease.dot",
        "lifecycle.dot",
        "sample-owed.dot",
        "sample-refused.dot",
        "sample.dot",
    ]
    assert stale_diagrams(REVIEW_DIAGRAMS, tmp_path / "out") == []


def test_cli_without_dot_says_how_to_install(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert main(["diagrams", "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "apt-get install graphviz" in error and "brew install graphviz" in error
    assert not (tmp_path / "out").exists(), "nothing may be written when svg/png cannot be rendered"
    with pytest.raises(GraphvizMissing, match="apt-get install graphviz"):
        render_source("digraph {}", "svg")


def test_bad_formats_are_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="'jpg'"):
        write_diagrams(tmp_path / "out", ["dot", "jpg"])
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="'gif'"):
        render_source("digraph {}", "gif")
    assert FORMATS == ("dot", "svg", "png")


# -- (4) the live queue snapshot --------------------------------------------------------------
def eagle3_tensors() -> dict[str, torch.Tensor]:
    return {
        "aux_hidden_states": torch.zeros(1, 2, 6),
        "input_ids": torch.zeros(1, 2, dtype=torch.long),
        "attention_mask": torch.ones(1, 2, dtype=torch.long),
        "loss_mask": torch.ones(1, 2, dtype=torch.long),
        "logits": torch.zeros(1, 2, 4),
    }


@pytest.fixture
def busy_queue() -> SampleRefQueue:
    """4 pending, 1 leased; 1 acked, 1 failed, 2 reclaimed leases so far; closed, so draining."""
    store = LocalFeatureStore(max_samples=None, max_bytes=1 << 30)
    now = [0.0]
    queue = SampleRefQueue(store, VisibilityTimeout(10.0), clock=lambda: now[0])
    for i in range(6):
        queue.put(store.put(f"s{i}", eagle3_tensors(), run_id="run"))
    leases = [queue.acquire(poll_interval=0) for _ in range(4)]
    assert all(leases)
    queue.ack(leases[0])  # type: ignore[arg-type]
    queue.fail(leases[1])  # type: ignore[arg-type]
    now[0] = 100.0
    assert queue.reclaim_expired() == 2
    assert queue.acquire(poll_interval=0) is not None
    queue.close()
    return queue


def node_lines(source: str) -> dict[str, str]:
    return dict(re.findall(r"^\t\t(\w+) \[(.*)\]$", source, re.M))


def test_queue_render_annotates_counts_and_current_states(busy_queue: SampleRefQueue, tmp_path: pathlib.Path) -> None:
    counts, stats = busy_queue.lease_state_counts(), busy_queue.stats()
    assert counts == {"pending": 4, "leased": 1} and (stats.acked, stats.failed, stats.reclaimed) == (1, 1, 2)
    render_queue(busy_queue, tmp_path / "snapshot.dot")
    nodes = node_lines((tmp_path / "snapshot.dot").read_text())
    for state, count in counts.items():
        assert nodes[state].startswith(f'label="{state}\\l{count} now\\l" color=firebrick'), nodes[state]
    for state in LEASE.terminal:
        assert nodes[state].startswith(f'label="{state}\\l{getattr(stats, state)} so far\\l"'), nodes[state]
        assert "firebrick" not in nodes[state]
    assert (busy_queue.backpressure_state, busy_queue.lifecycle_state) == ("flowing", "draining")
    highlighted = {name for name, attrs in nodes.items() if "color=firebrick" in attrs}
    assert highlighted == {"pending", "leased", "flowing", "draining"}


def test_queue_render_svg(busy_queue: SampleRefQueue, tmp_path: pathlib.Path) -> None:
    if shutil.which("dot") is None:
        pytest.skip(NEEDS_DOT)
    render_queue(busy_queue, tmp_path / "snapshot.svg")
    text = svg_text((tmp_path / "snapshot.svg").read_bytes())
    for phrase in ("pending", "4 now", "reclaimed", "2 so far", "flowing", "draining"):
        assert phrase in text, f"snapshot svg lacks {phrase!r}: {text}"


def test_queue_render_refuses_an_unknown_suffix(busy_queue: SampleRefQueue, tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match=r"snapshot\.txt"):
        render_queue(busy_queue, tmp_path / "snapshot.txt")
    assert not (tmp_path / "snapshot.txt").exists()
    render_queue(busy_queue, tmp_path / "snapshot.txt", format="dot")
    assert (tmp_path / "snapshot.txt").read_text().startswith("digraph queue_snapshot {")


def test_sample_diagrams_show_where_the_bytes_are() -> None:
    labelled = set()
    for view in SAMPLE_VIEWS:
        source = (DIAGRAMS / f"{view.name}.dot").read_text()
        labels = {
            name.strip('"'): label for name, label in re.findall(r'^\t("?[\w-]+"?) \[label="(.*?)\\l"', source, re.M)
        }
        for state in view.states:
            # the label is wrapped onto lines; read as one sentence it is the state and its residency
            assert labels[state].replace("\\n", " ") == f"{state} {RESIDENCY[state]}", f"{view.name}.dot: {state!r}"
            labelled.add(state)
    assert labelled == set(RESIDENCY) == set(SAMPLE.states)
    assert {t.spec_action for t in SAMPLE.transitions} >= {"Enqueue", "Ack", "Fail", "Reclaim", "RetryScrub"}


def test_the_sample_views_split_the_spec_table_without_losing_a_transition() -> None:
    drawn = [row for view in SAMPLE_VIEWS for row in view.transitions]
    assert sorted(drawn, key=repr) == sorted(SAMPLE.transitions, key=repr), "each transition in exactly one view"
    assert [view.name for view in SAMPLE_VIEWS] == ["sample", "sample-refused", "sample-owed"]
    main_view = SAMPLE_VIEWS[0]
    assert main_view.initial == "absent"
    assert {"absent", "stored", "paused", "pending", "leased", "acked", "dead", "dead-kept"} == set(main_view.states)
    for view in SAMPLE_VIEWS:
        assert view.initial in view.states
        assert all({row.source, row.dest} <= set(view.states) for row in view.transitions)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_the_sample_diagrams_fit_on_one_screen() -> None:
    for view in SAMPLE_VIEWS:
        width, height = png_size((DIAGRAMS / f"{view.name}.png").read_bytes())
        assert width <= SCREEN_PX and height <= SCREEN_PX, f"diagrams/{view.name}.png is {width}x{height}"


def test_the_screen_check_has_teeth() -> None:
    """The whole table on one page, laid out as the small machines are, is far wider than a screen."""
    if shutil.which("dot") is None:
        pytest.skip(NEEDS_DOT)
    whole = dataclasses.replace(SAMPLE, name="lease")  # the lease diagram's layout: left to right, unwrapped
    width, _ = png_size(render_source(machine_dot(whole, build_machine(whole)), "png"))
    assert width > 2 * SCREEN_PX
