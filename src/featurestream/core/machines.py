"""The coordinator's state machines, as data: the lease lifecycle, backpressure, queue lifecycle.

Each table is the single source for the running ``transitions`` machine, the
rendered diagrams and the check against ``spec/LeaseQueue.tla``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transitions import Machine, MachineError

from featurestream.common.errors import IllegalTransition

__all__ = [
    "BACKPRESSURE",
    "HELD",
    "LEASE",
    "LIFECYCLE",
    "MachineTable",
    "SETTLED",
    "TableMachine",
    "Transition",
    "build_machine",
    "fire",
]


@dataclasses.dataclass(frozen=True)
class Transition:
    """One edge: ``trigger`` moves ``source`` to ``dest`` when ``guard`` holds."""

    trigger: str
    source: str
    dest: str
    method: str
    guard: str
    spec_action: str


@dataclasses.dataclass(frozen=True)
class MachineTable:
    """States and transitions of one machine."""

    name: str
    states: tuple[str, ...]
    initial: str
    terminal: tuple[str, ...]
    transitions: tuple[Transition, ...]


LEASE = MachineTable(
    name="lease",
    states=("pending", "leased", "acked", "failed", "reclaimed"),
    initial="pending",
    terminal=("acked", "failed", "reclaimed"),
    transitions=(
        Transition("lease", "pending", "leased", "acquire()", "head of the pending FIFO", "Acquire"),
        Transition("extend", "leased", "leased", "extend(lease)", "lease is the live one", "Extend"),
        Transition("ack", "leased", "acked", "ack(lease)", "lease is the live one", "Ack"),
        Transition("fail", "leased", "failed", "fail(lease)", "lease is the live one", "Fail"),
        Transition("reclaim", "leased", "reclaimed", "reclaim_expired() / any call", "clock >= deadline", "Reclaim"),
        Transition("give_back", "leased", "pending", "give_back(lease)", "lease is the live one", "GiveBack"),
    ),
)

# A sample as the queue sees it: held (pending, or leased by the lease machine) or settled for good (the
# dedup window's outcomes: acked, or dead-lettered once its deliveries were spent).
HELD = ("pending", "leased")
SETTLED = ("acked", "dead")

BACKPRESSURE = MachineTable(
    name="backpressure",
    states=("flowing", "paused"),
    initial="flowing",
    terminal=(),
    transitions=(
        Transition("pause", "flowing", "paused", "put_blocks_until_below()", "resident >= high watermark", "Pause"),
        Transition("resume", "paused", "flowing", "put_blocks_until_below()", "resident <= low watermark", "Resume"),
    ),
)

LIFECYCLE = MachineTable(
    name="lifecycle",
    states=("open", "draining", "drained"),
    initial="open",
    terminal=("drained",),
    transitions=(
        Transition("close", "open", "draining", "close()", "always", "Close"),
        Transition(
            "drain", "draining", "drained", "close() / ack() / fail() / reclaim", "nothing pending or leased", "Drain"
        ),
    ),
)


class TableMachine(Machine):
    """A ``transitions`` machine built from ``table``, which names it when it refuses a trigger.

    ``edges``: trigger -> {source: dest}, read back from the machine's own events once it is built. None of
    these machines has a condition or a callback (the coordinator's work happens around a trigger, not in
    it), so a trigger's whole effect is to move the model along its edge; ``fire`` takes that edge directly
    instead of going through ``Event.trigger``, which builds an ``EventData`` and walks empty callback lists
    on every trigger (the queue fires two or three per sample). A machine given
    callbacks or conditions has no ``edges``, and ``fire`` runs its events as ``transitions`` does.
    """

    def __init__(self, table: MachineTable) -> None:
        super().__init__(
            model=None,
            states=list(table.states),
            initial=table.initial,
            transitions=[{"trigger": t.trigger, "source": t.source, "dest": t.dest} for t in table.transitions],
            auto_transitions=False,
            ignore_invalid_triggers=False,
        )
        self.table = table
        self.edges: dict[str, dict[str, str]] | None = self._plain_edges()

    def _plain_edges(self) -> dict[str, dict[str, str]] | None:
        """The machine's edges, when taking one is all a trigger does (no callbacks, no conditions)."""
        hooks = (self.before_state_change, self.after_state_change, self.prepare_event, self.finalize_event)
        if any(hooks) or self.on_exception or any(s.on_enter or s.on_exit for s in self.states.values()):
            return None
        edges: dict[str, dict[str, str]] = {}
        for trigger, event in self.events.items():
            for source, moves in event.transitions.items():
                if len(moves) != 1:
                    return None
                move = moves[0]
                if move.conditions or move.prepare or move.before or move.after:
                    return None
                edges.setdefault(trigger, {})[source] = move.dest if move.dest is not None else source
        return edges


def build_machine(table: MachineTable) -> TableMachine:
    """A ``transitions`` machine for ``table`` with no bound model.

    Models are plain objects with a ``state`` attribute whose ``str`` names them (``lease 7 of sample 's0'``);
    ``fire`` drives them, so one machine serves any number of models at O(1) per trigger.
    """
    return TableMachine(table)


def fire(machine: TableMachine, trigger: str, model: Any) -> None:
    """Fire ``trigger`` on ``model``.

    A trigger the table does not allow from the model's state means the coordinator (or the server it reads)
    broke the lifecycle: ``IllegalTransition`` naming the machine, the model, its state and the trigger, with
    the state untouched. Callers fire only what their engine reported, so it never passes silently.
    """
    edges = machine.edges
    if edges is not None:
        try:  # two subscripts in a try that costs nothing unless it raises: the queue fires two per sample
            model.state = edges[trigger][model.state]
            return
        except KeyError:  # no such trigger, or no edge from the model's state
            pass
    else:
        try:
            machine.events[trigger].trigger(model)
            return
        except MachineError:
            pass
    state = str(getattr(model, "state", "?"))
    raise IllegalTransition(machine.table.name, str(model), state, trigger) from None


# The running machines: one per table, shared by every queue (models carry the state).
LEASE_MACHINE = build_machine(LEASE)
BACKPRESSURE_MACHINE = build_machine(BACKPRESSURE)
LIFECYCLE_MACHINE = build_machine(LIFECYCLE)
