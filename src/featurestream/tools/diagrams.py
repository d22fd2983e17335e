"""State diagrams of the coordinator, drawn from the very ``transitions`` machines the queue runs.

``featurestream diagrams [--out DIR] [--format svg|png|dot]`` writes ``lease``,
``backpressure`` and ``lifecycle``, and the spec's sample lifecycle in three
views (``sample``, ``sample-refused``, ``sample-owed``: see ``sample_views``), as
DOT (always possible), SVG and PNG (need graphviz's ``dot`` binary). ``render_queue(queue, path)`` draws a live
queue's snapshot: how many leases sit in each lease state, and the current
backpressure and lifecycle states.

The graphs are drawn by walking the states and event transitions of the
queue's machine objects; the table rows of ``featurestream.core.machines`` only
supply the words on the edges (queue method, guard, spec action). The DOT text
is written by ``featurestream.tools.dot`` (no Python package needed) and is
deterministic, so the committed copies in ``diagrams/`` can be compared byte for
byte with a regeneration (``tests/tools/test_diagrams.py`` does).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from transitions import Machine

from featurestream.common.errors import FeatureStreamError
from featurestream.core.machines import (
    BACKPRESSURE,
    BACKPRESSURE_MACHINE,
    LEASE,
    LEASE_MACHINE,
    LIFECYCLE,
    LIFECYCLE_MACHINE,
    MachineTable,
    Transition,
    build_machine,
)
from featurestream.spec.lifecycle import RESIDENCY, SAMPLE
from featurestream.tools.dot import Digraph

if TYPE_CHECKING:
    from featurestream.core.protocol import LeaseQueue

__all__ = [
    "FORMATS",
    "LIVE_MACHINES",
    "REVIEW_DIAGRAMS",
    "REFRESH_COMMAND",
    "SAMPLE_DETOURS",
    "SAMPLE_VIEWS",
    "GraphvizMissing",
    "QueueSnapshot",
    "configure",
    "machine_dot",
    "render_queue",
    "render_source",
    "run",
    "sample_views",
    "snapshot_dot",
    "write_diagrams",
]

FORMATS = ("dot", "svg", "png")
REFRESH_COMMAND = "featurestream diagrams --out diagrams"
INSTALL_DOT = (
    "graphviz's `dot` binary is not on PATH; it is needed to render svg/png. Install it with "
    "`sudo apt-get install graphviz` (Debian/Ubuntu), `brew install graphviz` (macOS) or from "
    "https://graphviz.org/download/ -- or ask for `--format dot`, which needs no binary."
)

# The queue's own machine objects, not rebuilt copies: what is drawn is what runs.
LIVE_MACHINES: tuple[tuple[MachineTable, Machine], ...] = (
    (LEASE, LEASE_MACHINE),
    (BACKPRESSURE, BACKPRESSURE_MACHINE),
    (LIFECYCLE, LIFECYCLE_MACHINE),
)
# The detours of the sample lifecycle, each drawn on its own: a put the queue refused, and the bytes a
# failed scrub leaves owed. Every other transition is the main lifecycle's, ``sample``.
SAMPLE_DETOURS: dict[str, tuple[str, ...]] = {
    "sample-refused": ("raised", "raised-retained", "discarded", "discarded-owed"),
    "sample-owed": ("acked-owed", "dead-owed"),
}


def sample_views() -> tuple[MachineTable, ...]:
    """``SAMPLE`` split into the main lifecycle and its detours; every transition is in exactly one view.

    The 40 transitions of 14 states on one page are five screens wide. A
    transition belongs to the detour whose states it touches (none touches
    two), else to ``sample``; a view's states are those its transitions join,
    and its initial state the first of them no transition of the view enters.
    """
    groups: dict[str, list[Transition]] = {SAMPLE.name: [], **{name: [] for name in SAMPLE_DETOURS}}
    for row in SAMPLE.transitions:
        touched = [name for name, states in SAMPLE_DETOURS.items() if {row.source, row.dest} & set(states)]
        groups[touched[0] if touched else SAMPLE.name].append(row)
    views = []
    for name, rows in groups.items():
        states = tuple(s for s in SAMPLE.states if any(s in (row.source, row.dest) for row in rows))
        entered = {row.dest for row in rows}
        initial = SAMPLE.initial if name == SAMPLE.name else next(s for s in states if s not in entered)
        terminal = tuple(s for s in SAMPLE.terminal if s in states)
        views.append(MachineTable(name, states, initial, terminal, tuple(rows)))
    return tuple(views)


# The sample lifecycle is the spec's, not a running machine: drawn from its table, which a test
# (tests/spec/test_lifecycle.py) holds to the edges the spec mirror really takes.
SAMPLE_VIEWS = sample_views()
REVIEW_DIAGRAMS: tuple[tuple[MachineTable, Machine], ...] = (
    *LIVE_MACHINES,
    *((view, build_machine(view)) for view in SAMPLE_VIEWS),
)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """How one diagram is laid out when the default (left to right, one line per label part) is too wide.

    ``graph`` overrides the graph attributes; each tuple of ``ranks`` is drawn
    on one row; ``wrap`` breaks every line of the node and edge labels at that
    many characters (between words), so labels stack instead of widening.
    """

    graph: Mapping[str, str] = dataclasses.field(default_factory=dict)
    ranks: tuple[tuple[str, ...], ...] = ()
    wrap: int | None = None

    def lines(self, text: str) -> str:
        """``text`` with its lines wrapped at ``wrap``, in DOT's ``\n`` escape."""
        if self.wrap is None:
            return text
        wrapped = (
            textwrap.wrap(part, self.wrap, break_long_words=False, break_on_hyphens=False) for part in text.split(r"\n")
        )
        return r"\n".join(line for lines in wrapped for line in lines or [""])


_DEFAULT_LAYOUT = _Layout()
# The sample views' labels (where the bytes are, the guards) are sentences: wrapped, they stack.
_SAMPLE_LAYOUT = _Layout(graph={"rankdir": "TB", "nodesep": "0.5", "ranksep": "0.5"}, wrap=30)
_LAYOUTS: dict[str, _Layout] = {
    SAMPLE.name: dataclasses.replace(_SAMPLE_LAYOUT, ranks=(("acked", "dead", "dead-kept"),)),  # the settled row
    **{name: _SAMPLE_LAYOUT for name in SAMPLE_DETOURS},
}
_SAMPLE_NODES = {state: _SAMPLE_LAYOUT.lines(rf"{state}\n{where}") for state, where in RESIDENCY.items()}
_NODE_LABELS: dict[str, Mapping[str, str]] = {view.name: _SAMPLE_NODES for view in SAMPLE_VIEWS}

# Titles in DOT's escapes: "\n" breaks a line. Edge labels read "trigger: queue method / [guard] / (spec action)".
_TITLES = {
    "lease": r"lease: one delivery attempt of a sample (double border: terminal for this lease)\n"
    r"after failed or reclaimed the sample re-enters as a new pending lease, or is dead-lettered",
    "backpressure": r"backpressure: the producer in put_blocks_until_below()\n"
    r"between the watermarks the state holds (hysteresis)",
    "lifecycle": r"lifecycle: the queue as a whole\ndrained: acquire() returns None for good",
    "sample": r"sample: one sample from the producer's store write to acked or dead (from the spec)\n"
    r"each state with where its bytes are; detours: sample-refused (the put raised), sample-owed (a scrub failed)",
    "sample-refused": r"sample-refused: the producer's put raised (abort, close, a store fault)\n"
    r"and it discards the sample; owed: the unretain of a refused put failed and is retried",
    "sample-owed": r"sample-owed: the scrub of a settled sample failed: the settlement stands, the bytes are owed\n"
    r"and the scrub is retried until they leave",
}
_FONT = "Helvetica"
_GRAPH_ATTRS = {
    "rankdir": "LR",
    "nodesep": "0.5",
    "ranksep": "0.9",
    "fontname": _FONT,
    "fontsize": "14",
    "labelloc": "t",
}
_NODE = {
    "shape": "rectangle",
    "style": "rounded,filled",
    "fillcolor": "white",
    "color": "black",
    "peripheries": "1",
    "fontname": _FONT,
    "fontsize": "12",
    "margin": "0.15,0.08",
}
_EDGE = {"color": "gray25", "fontname": _FONT, "fontsize": "10"}
_TERMINAL = {"peripheries": "2", "fillcolor": "gray92"}
_CURRENT = {"color": "firebrick", "fillcolor": "mistyrose", "penwidth": "2"}
# dot's default 96 dpi gives a blurry PNG on review screens; svg scales by itself.
_PNG_DPI = "-Gdpi=144"


class GraphvizMissing(FeatureStreamError, RuntimeError):
    """graphviz's ``dot`` binary, needed for svg/png, is not installed; the message says how."""


@dataclasses.dataclass(frozen=True)
class QueueSnapshot:
    """What a queue diagram is annotated with.

    ``lease_counts`` maps every lease state to a count: leases there now for
    the live states, leases that ended there so far for the terminal ones.
    ``dead_lettered`` counts samples whose deliveries were spent.
    """

    lease_counts: Mapping[str, int]
    backpressure: str
    lifecycle: str
    dead_lettered: int


def _edge_label(row: Transition, layout: _Layout = _DEFAULT_LAYOUT) -> str:
    # DOT's own "\n" escape, so the label breaks the same way in every renderer.
    label = layout.lines(rf"{row.trigger}: {row.method}\n[{row.guard}]\n(spec {row.spec_action})")
    # Parallel edges share one arrow, their labels joined by " | ": wrapped, each then starts a line of its own.
    return label + r"\n" if layout.wrap is not None else label


def _live_edges(table: MachineTable, machine: Machine) -> list[Transition]:
    """The machine's transitions in firing order, each matched to its table row (for the labels)."""
    rows = {(t.trigger, t.source, t.dest): t for t in table.transitions}
    edges = []
    for trigger, event in machine.events.items():
        for source, transitions in event.transitions.items():
            for transition in transitions:
                key = (trigger, source, transition.dest)
                if key not in rows:
                    raise LookupError(
                        f"the {table.name} machine has transition {key} that its table lacks; "
                        "build the machine with featurestream.core.machines.build_machine"
                    )
                edges.append(rows[key])
    return edges


def _graph(
    table: MachineTable,
    machine: Machine,
    *,
    title: str,
    node_labels: Mapping[str, str],
    current: Sequence[str] = (),
) -> Digraph:
    """Draw ``machine``'s states and event transitions; ``current`` states are highlighted."""
    layout = _LAYOUTS.get(table.name, _DEFAULT_LAYOUT)
    edges = _live_edges(table, machine)
    # Terminal as the machine runs it: no edge leaves the state (the test checks this equals table.terminal).
    terminal = set(machine.states) - {row.source for row in edges}
    graph = Digraph(table.name, graph={**_GRAPH_ATTRS, **layout.graph, "label": title}, node=_NODE, edge=_EDGE)
    for name in machine.states:
        style = {**(_TERMINAL if name in terminal else {}), **(_CURRENT if name in current else {})}
        graph.node(name, label=node_labels.get(name, name) + r"\l", **style)  # "\l": left-aligned lines
    # Parallel edges share one arrow; the arrows are grouped by source, in the order the machine lists them.
    labels: dict[str, dict[str, list[str]]] = {}
    for row in edges:
        labels.setdefault(row.source, {}).setdefault(row.dest, []).append(_edge_label(row, layout))
    for source, dests in labels.items():
        for dest, parts in dests.items():
            graph.edge(source, dest, label=" | ".join(parts))
    start = f"{table.name}__start"
    graph.node(start, label="", shape="point", width="0.12", style="filled", fillcolor="black")
    graph.edge(start, machine.initial, color="black")
    for row, names in enumerate(layout.ranks):
        graph.same_rank(f"{table.name}__row{row}", names)
    return graph


def machine_dot(table: MachineTable, machine: Machine) -> str:
    """The deterministic DOT source of one machine's reference diagram."""
    return _graph(table, machine, title=_TITLES[table.name], node_labels=_NODE_LABELS.get(table.name, {})).source


def _snapshot_parts(
    snapshot: QueueSnapshot,
) -> tuple[tuple[MachineTable, Machine, dict[str, str], list[str]], ...]:
    """``(table, machine, node labels, current states)`` of each machine in a snapshot, in reading order."""
    lease_labels = {
        state: rf"{state}\l{snapshot.lease_counts.get(state, 0)} {'so far' if state in LEASE.terminal else 'now'}"
        for state in LEASE.states
    }
    occupied = [s for s in LEASE.states if s not in LEASE.terminal and snapshot.lease_counts.get(s, 0)]
    return (
        (LEASE, LEASE_MACHINE, lease_labels, occupied),
        (BACKPRESSURE, BACKPRESSURE_MACHINE, {}, [snapshot.backpressure]),
        (LIFECYCLE, LIFECYCLE_MACHINE, {}, [snapshot.lifecycle]),
    )


def _snapshot_title(snapshot: QueueSnapshot) -> str:
    return (
        rf"featurestream queue snapshot: {snapshot.dead_lettered} dead-lettered so far\n"
        "red: where leases are now, and the current backpressure and lifecycle states"
    )


def snapshot_dot(snapshot: QueueSnapshot) -> str:
    """One DOT graph with the three machines side by side, annotated with ``snapshot``."""
    root = Digraph("queue_snapshot", graph={**_GRAPH_ATTRS, "label": _snapshot_title(snapshot)})
    # dot stacks rankdir=LR clusters bottom-up: add them in reverse to read lease, backpressure, lifecycle.
    for table, machine, labels, current in reversed(_snapshot_parts(snapshot)):
        sub = _graph(table, machine, title=_TITLES[table.name], node_labels=labels, current=current)
        sub.name = f"cluster_{table.name}"  # a "cluster_" subgraph gets its own box and title
        root.subgraph(sub)
    return root.source


def render_source(source: str, fmt: str) -> bytes:
    """``source`` (DOT) rendered as ``fmt``; ``svg``/``png`` run graphviz's ``dot`` binary.

    Raises ``ValueError`` for an unknown format, ``GraphvizMissing`` without
    ``dot``, ``RuntimeError`` when ``dot`` rejects the source.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if fmt == "dot":
        return source.encode()
    binary = shutil.which("dot")
    if binary is None:
        raise GraphvizMissing(INSTALL_DOT)
    command = [binary, f"-T{fmt}", *([_PNG_DPI] if fmt == "png" else [])]
    done = subprocess.run(command, input=source.encode(), capture_output=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode}): {done.stderr.decode().strip()}")
    return done.stdout


def write_diagrams(out_dir: str | os.PathLike[str], formats: Sequence[str] = FORMATS) -> list[pathlib.Path]:
    """Write ``<machine>.<format>`` for every machine into ``out_dir``; return the paths written.

    Checks the formats and the ``dot`` binary before writing anything.
    """
    for fmt in formats:
        if fmt not in FORMATS:
            raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if any(fmt != "dot" for fmt in formats) and shutil.which("dot") is None:
        raise GraphvizMissing(INSTALL_DOT)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for table, machine in REVIEW_DIAGRAMS:
        source = machine_dot(table, machine)
        for fmt in formats:
            path = out / f"{table.name}.{fmt}"
            path.write_bytes(render_source(source, fmt))
            written.append(path)
    return written


def _format_of(path: pathlib.Path, fmt: str | None) -> str:
    if fmt is not None:
        return fmt
    suffix = path.suffix.lstrip(".").lower()
    if suffix not in FORMATS:
        raise ValueError(f"cannot tell the format of {str(path)!r} from its suffix; pass format= one of {FORMATS}")
    return suffix


def render_queue(queue: LeaseQueue, path: str | os.PathLike[str], format: str | None = None) -> pathlib.Path:
    """Draw ``queue``'s snapshot to ``path`` (any backend); return the path.

    ``format`` is ``svg``, ``png`` or ``dot`` (default: the suffix of ``path``); svg/png need graphviz's ``dot``
    binary. The lease counts come from one ``queue.stats()`` call, so they are
    mutually consistent (its ``pending``/``outstanding`` are
    ``lease_state_counts()``'s ``pending``/``leased``; each terminal state has
    the counter of the same name). Nothing is written when rendering fails.
    """
    target = pathlib.Path(path)
    fmt = _format_of(target, format)
    stats = queue.stats()
    counts = {"pending": stats.pending, "leased": stats.outstanding}
    counts.update({state: getattr(stats, state) for state in LEASE.terminal})
    snapshot = QueueSnapshot(
        counts,
        backpressure=queue.backpressure_state,
        lifecycle=queue.lifecycle_state,
        dead_lettered=stats.dead_lettered,
    )
    data = render_source(snapshot_dot(snapshot), fmt)
    target.write_bytes(data)
    return target


# -- CLI: featurestream diagrams ---------------------------------------------------
def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Render the lease, backpressure and lifecycle state diagrams from the live machines, "
        "and the sample lifecycle from the spec's table."
    )
    parser.add_argument("--out", default="diagrams", help="output directory (default: %(default)s)")
    parser.add_argument(
        "--format",
        dest="formats",
        action="append",
        choices=FORMATS,
        help="format to write; repeat for several (default: dot, svg and png)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        written = write_diagrams(args.out, args.formats or FORMATS)
    except GraphvizMissing as error:
        print(f"featurestream diagrams: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0
