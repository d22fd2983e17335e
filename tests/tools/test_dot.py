"""featurestream writes the DOT itself: byte for byte what ``transitions``' GraphMachine and graphviz's package write.

The reference drawings below go through GraphMachine (graphviz backend) and
``graphviz.Digraph``, the way the diagrams were drawn before featurestream
wrote DOT itself; the library must produce the same bytes for every review
diagram and for queue snapshots. Without the graphviz package the library
still writes DOT (a subprocess where ``import graphviz`` fails).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from transitions import Machine, State

from featurestream.core.machines import MachineTable
from featurestream.tools import diagrams
from featurestream.tools.diagrams import REVIEW_DIAGRAMS, QueueSnapshot, machine_dot, snapshot_dot
from featurestream.tools.dot import Digraph, quote

ROOT = pathlib.Path(__file__).resolve().parents[2]
NEEDS_GRAPHVIZ = "the graphviz Python package (in the test extra) is the reference the DOT writer is compared with"


@pytest.fixture(scope="module")
def graphviz() -> Any:
    return pytest.importorskip("graphviz", reason=NEEDS_GRAPHVIZ)


# -- the reference: GraphMachine and graphviz.Digraph -----------------------------------------
class _Model:
    state: str


def reference_graph(part: tuple[MachineTable, Machine, Mapping[str, str], Sequence[str]], title: str) -> Any:
    """``machine`` drawn by GraphMachine with the graphviz backend, styled as featurestream styles it."""
    from transitions.extensions import GraphMachine

    table, machine, node_labels, current = part
    layout = diagrams._LAYOUTS.get(table.name, diagrams._DEFAULT_LAYOUT)
    edges = diagrams._live_edges(table, machine)
    terminal = set(machine.states) - {row.source for row in edges}
    states = []
    for name in machine.states:
        state = State(name)
        state.label = node_labels.get(name, name)  # GraphMachine's markup reads State.label
        states.append(state)
    model = _Model()
    drawer = GraphMachine(
        model=model,
        states=states,
        initial=machine.initial,
        transitions=[
            {"trigger": row.trigger, "source": row.source, "dest": row.dest, "label": diagrams._edge_label(row, layout)}
            for row in edges
        ],
        auto_transitions=False,
        graph_engine="graphviz",
        title=title,
    )
    drawer.machine_attributes = {**diagrams._GRAPH_ATTRS, **layout.graph}
    drawer.style_attributes = {
        "node": {
            "default": diagrams._NODE,
            "terminal": diagrams._TERMINAL,
            "current": diagrams._CURRENT,
            "current_terminal": {**diagrams._TERMINAL, **diagrams._CURRENT},
        },
        "edge": {"default": diagrams._EDGE},
    }
    styling = drawer.model_graphs[id(model)]
    styling.reset_styling()  # GraphMachine marks the initial state "active" by itself
    for name in machine.states:
        if name in current:
            styling.set_node_style(name, "current_terminal" if name in terminal else "current")
        elif name in terminal:
            styling.set_node_style(name, "terminal")
    graph = model.get_graph(title=title)
    graph.name = table.name
    start = f"{table.name}__start"
    graph.node(start, label="", shape="point", width="0.12", style="filled", fillcolor="black")
    graph.edge(start, machine.initial, color="black")
    for row, names in enumerate(layout.ranks):
        with graph.subgraph(name=f"{table.name}__row{row}") as same:
            same.attr(rank="same")
            for name in names:
                same.node(name)
    return graph


def reference_machine_dot(table: MachineTable, machine: Machine) -> str:
    labels = diagrams._NODE_LABELS.get(table.name, {})
    return reference_graph((table, machine, labels, ()), diagrams._TITLES[table.name]).source


def reference_snapshot_dot(graphviz: Any, snapshot: QueueSnapshot) -> str:
    root = graphviz.Digraph(
        "queue_snapshot", graph_attr={**diagrams._GRAPH_ATTRS, "label": diagrams._snapshot_title(snapshot)}
    )
    for part in reversed(diagrams._snapshot_parts(snapshot)):
        sub = reference_graph(part, diagrams._TITLES[part[0].name])
        sub.name = f"cluster_{part[0].name}"
        root.subgraph(sub)
    return root.source


SNAPSHOTS = {
    "empty": QueueSnapshot({}, backpressure="flowing", lifecycle="open", dead_lettered=0),
    "busy": QueueSnapshot(
        {"pending": 4, "leased": 1, "acked": 1, "failed": 1, "reclaimed": 2},
        backpressure="paused",
        lifecycle="draining",
        dead_lettered=3,
    ),
    # drained is terminal: the current style and the terminal one on the same node
    "drained": QueueSnapshot({"acked": 7}, backpressure="flowing", lifecycle="drained", dead_lettered=1),
}


# -- the writer equals the real thing -----------------------------------------------------------
@pytest.mark.parametrize("table,machine", REVIEW_DIAGRAMS, ids=[table.name for table, _ in REVIEW_DIAGRAMS])
def test_every_review_diagram_is_what_graphmachine_writes(graphviz: Any, table: MachineTable, machine: Machine) -> None:
    assert machine_dot(table, machine) == reference_machine_dot(table, machine)


@pytest.mark.parametrize("name", SNAPSHOTS)
def test_every_snapshot_is_what_graphmachine_writes(graphviz: Any, name: str) -> None:
    assert snapshot_dot(SNAPSHOTS[name]) == reference_snapshot_dot(graphviz, SNAPSHOTS[name])


def test_the_drawings_compared_have_parallel_edges_rank_rows_clusters_and_quoted_ids() -> None:
    # The comparisons above only prove what the drawings contain: make sure they hold every construct.
    sample = machine_dot(*next((t, m) for t, m in REVIEW_DIAGRAMS if t.name == "sample"))
    assert '"\n | ' not in sample and "\\n | " in sample, "no parallel edges joined by ' | '"
    assert "\tsubgraph sample__row0 {\n\t\trank=same\n" in sample and '\t\t"dead-kept"\n' in sample
    assert "digraph sample {" in sample and '\t"dead-kept" -> pending [' in sample
    snapshot = snapshot_dot(SNAPSHOTS["drained"])
    assert "\tsubgraph cluster_lease {\n\t\tgraph [" in snapshot
    assert '\t\tdrained [label="drained\\l" color=firebrick fillcolor=mistyrose penwidth=2 peripheries=2]' in snapshot


IDS = [
    "pending",
    "_x9",
    "dead-kept",
    "sample-owed__start",
    "",
    "9lives",
    "-4.2",
    ".42",
    "1.",
    "-",
    "graph",
    "Node",
    "STRICT",
    "subgraphs",
    "a b",
    'say "hi"',
    'already \\"escaped\\"',
    'pair \\\\"',
    r"left\lnew\nline",
    "0.15,0.08",
    "caf\u00e9",
    "<b>",
]


def test_quote_is_graphviz_quoting(graphviz: Any) -> None:
    from graphviz.quoting import nohtml
    from graphviz.quoting import quote as graphviz_quote

    # nohtml: featurestream never writes HTML labels, "<b>" is text to it
    assert [quote(text) for text in IDS] == [graphviz_quote(nohtml(text)) for text in IDS]


def test_a_graph_of_awkward_ids_is_what_graphviz_writes(graphviz: Any) -> None:
    ours = Digraph("my graph", graph={"rankdir": "TB", "label": 'a "title"'}, node={"shape": "box"})
    theirs = graphviz.Digraph(
        "my graph", graph_attr={"rankdir": "TB", "label": 'a "title"'}, node_attr={"shape": "box"}
    )
    for graph in (ours, theirs):
        graph.node("edge", label=r"a\lb", z="1", a="x y")
        graph.node("dead-kept")
        graph.edge("edge", "dead-kept", label="", color="black")
        graph.edge("1", "-2.5", weight="3")
    inner = Digraph("cluster_in", graph={"label": "in"})
    inner.node("x")
    inner.same_rank("row", ("x", "dead-kept"))
    ours.subgraph(inner)
    theirs_inner = graphviz.Digraph("cluster_in", graph_attr={"label": "in"})
    theirs_inner.node("x")
    with theirs_inner.subgraph(name="row") as row:
        row.attr(rank="same")
        row.node("x")
        row.node("dead-kept")
    theirs.subgraph(theirs_inner)
    assert ours.source == theirs.source


def test_an_unpaired_final_backslash_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unpaired backslash: 'label\\\\'"):
        quote("label\\")
    assert quote("label\\\\") == '"label\\\\"'


# -- without the graphviz package ------------------------------------------------------------------
def test_dot_needs_no_graphviz_package(tmp_path: pathlib.Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["graphviz"] = None  # import graphviz now raises ImportError
        from featurestream.cli import main
        from featurestream import LocalFeatureStore, SampleRefQueue, render_queue
        assert main(["diagrams", "--format", "dot", "--out", {str(tmp_path / "out")!r}]) == 0
        render_queue(SampleRefQueue(LocalFeatureStore()), {str(tmp_path / "queue.gv")!r}, format="dot")
        try:
            import graphviz
        except ImportError:
            print("graphviz unavailable")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ.copy(), check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "graphviz unavailable"
    committed = sorted((ROOT / "diagrams").glob("*.dot"))
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [p.name for p in committed]
    for path in committed:
        assert (tmp_path / "out" / path.name).read_bytes() == path.read_bytes(), path.name
    snapshot = QueueSnapshot({"pending": 0, "leased": 0}, backpressure="flowing", lifecycle="open", dead_lettered=0)
    assert (tmp_path / "queue.gv").read_text() == snapshot_dot(snapshot)


def test_svg_needs_only_the_dot_binary(tmp_path: pathlib.Path) -> None:
    if shutil.which("dot") is None:
        pytest.skip("graphviz's `dot` binary is missing: install it (apt-get install graphviz / brew install graphviz)")
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["graphviz"] = None
        from featurestream.cli import main
        assert main(["diagrams", "--format", "svg", "--out", {str(tmp_path)!r}]) == 0
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "lease.svg").read_bytes().lstrip().startswith(b"<?xml")
