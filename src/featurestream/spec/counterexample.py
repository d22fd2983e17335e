"""Read TLC's counterexample out of its console output and say, per step, what the action changed.

TLC prints a violating behaviour as every variable of every state (19 of
them here): the one change that matters is hard to see. ``parse`` returns
the states with their action; ``Counterexample.describe`` prints one line per
step with the action and only the variables (and, inside functions, the
entries) that changed, and for a liveness violation the lasso: the loop the
behaviour repeats for ever (``Back to state N``) or the state it stutters in.
``meaning`` reads what a violated invariant or property means off the comment the
spec gives its definition, and ``config_description`` what a model config (a
mutant: which known defect it re-introduces) stands for off its header comment.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap

__all__ = ["Counterexample", "State", "changes", "config_description", "flatten", "meaning", "parse", "wrap"]

_STATE = re.compile(r"^State (\d+): (?:<(\w+)[^>]*>|(Stuttering))\s*$")
_BACK = re.compile(r"^Back to state (\d+)(?:: <(\w+)[^>]*>)?")
_VARIABLE = re.compile(r"^/\\ (\w+) = (.*)$")
_WIDTH = 110  # a step's changes wrap onto indented lines past this
_OPEN, _CLOSE = ("(", "[", "{", "<<"), (")", "]", "}", ">>")  # single < and > belong to :> and the like


@dataclasses.dataclass(frozen=True)
class State:
    """One state of the behaviour: its number, the action that led to it, its variables (TLC's text)."""

    number: int
    action: str
    variables: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Counterexample:
    """A violating behaviour; ``loop_to`` is the state a lasso returns to, ``loop_action`` the step back.

    ``stutters`` is true when the behaviour ends by stuttering for ever in its last state.
    """

    states: tuple[State, ...]
    loop_to: int | None = None
    loop_action: str | None = None
    stutters: bool = False

    def describe(self) -> list[str]:
        """One line per step: the action and what it changed; then the lasso, if any."""
        if not self.states:
            return []
        first = self.states[0]
        lines = [f"counterexample, {len(self.states)} states ({len(first.variables)} variables):"]
        lines.append(f"  1 {first.action}")
        previous = first
        for state in self.states[1:]:
            lines += _pack(f"  {state.number} {state.action}: ", changes(previous.variables, state.variables))
            previous = state
        if self.loop_to is not None:
            back = self.loop_action or "a step"
            lines.append(
                f"  lasso: states {self.loop_to}-{previous.number} repeat for ever "
                f"({back} leads from state {previous.number} back to state {self.loop_to})"
            )
        elif self.stutters:
            lines.append(f"  lasso: the behaviour stutters in state {previous.number} for ever")
        return lines


def meaning(module_text: str, name: str) -> str | None:
    """The comment the spec puts above ``name ==`` (its meaning), as one line; ``None`` when it has none.

    The comment may be separated from the definition by helper definitions glued to it (no blank line between),
    as a boxed comment above ``Helper == ...`` and ``name == ...`` is.
    """
    lines = module_text.splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(rf"{re.escape(name)}(\(.*\))? ==", line)), None)
    if start is None:
        return None
    comment: list[str] = []
    for line in reversed(lines[:start]):
        text = line.strip()
        if text.startswith("(*") and text.endswith("*)"):
            comment.insert(0, text[2:-2].strip(" *"))
        elif comment or not text:
            break  # the comment block ended, or a blank line before any comment
    joined = " ".join(part for part in comment if part)
    return re.sub(r"\s+", " ", joined) or None


def config_description(config_text: str) -> str | None:
    """The header comment of a TLC config (its leading ``\\*`` lines) as one line; ``None`` without one."""
    header: list[str] = []
    for line in config_text.splitlines():
        if not line.startswith("\\*"):
            break
        header.append(line[2:].strip())
    return " ".join(part for part in header if part) or None


def wrap(head: str, text: str) -> list[str]:
    """``head`` then ``text``, wrapped at the summary's width with the continuation lines indented."""
    return textwrap.wrap(head + text, width=_WIDTH, subsequent_indent="      ", break_on_hyphens=False)


def _pack(head: str, items: list[str]) -> list[str]:
    """``head`` and ``items`` joined by ``; ``, broken between items (never inside one) past ``_WIDTH``."""
    if not items:
        return [head + "nothing changed"]
    lines, line = [], head + items[0]
    for item in items[1:]:
        if len(line) + 2 + len(item) > _WIDTH:
            lines.append(line + ";")
            line = "      " + item
        else:
            line += "; " + item
    return [*lines, line]


def parse(output: str) -> Counterexample | None:
    """The behaviour TLC printed after its error, or ``None`` when it printed none."""
    states: list[State] = []
    loop_to: int | None = None
    loop_action: str | None = None
    stutters = False
    current: dict[str, str] | None = None
    name: str | None = None
    for line in output.splitlines():
        header = _STATE.match(line)
        if header:
            if header.group(3):
                stutters = True
                current = None
                continue
            action = "Init" if header.group(2) == "Initial" else header.group(2)  # <Initial predicate>
            current = {}
            states.append(State(int(header.group(1)), action, current))
            name = None
            continue
        back = _BACK.match(line)
        if back:
            loop_to, loop_action, current = int(back.group(1)), back.group(2), None
            continue
        if current is None:
            continue
        variable = _VARIABLE.match(line)
        if variable:
            name = variable.group(1)
            current[name] = variable.group(2).strip()
        elif line.strip() and name is not None and line.startswith(" "):
            current[name] += " " + line.strip()  # TLC wraps a long value onto indented lines
        elif not line.strip():
            current, name = None, None
    if not states:
        return None
    return Counterexample(tuple(states), loop_to, loop_action, stutters)


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """``var: old -> new`` for each variable that changed, entry by entry inside TLC functions."""
    out: list[str] = []
    for name, new in after.items():
        old = before.get(name)
        if old == new:
            continue
        if old is None:
            out.append(f"{name} = {new}")
            continue
        old_entries, new_entries = flatten(name, old), flatten(name, new)
        if old_entries.keys() == new_entries.keys() and name not in new_entries:
            out += [
                f"{key}: {old_entries[key]} -> {value}"
                for key, value in new_entries.items()
                if old_entries[key] != value
            ]
        else:
            out.append(f"{name}: {old} -> {new}")
    return out


def flatten(name: str, value: str) -> dict[str, str]:
    """A TLC function value ``(a :> x @@ b :> y)`` as ``{"name[a]": "x", "name[b]": "y"}``, nested ones too.

    Anything else (a set, a sequence, a string, a number) is one entry, ``{name: value}``.
    """
    entries = _function_entries(value)
    if entries is None:
        return {name: value}
    flat: dict[str, str] = {}
    for key, item in entries:
        flat.update(flatten(f"{name}[{key}]", item))
    return flat


def _function_entries(value: str) -> list[tuple[str, str]] | None:
    if not (value.startswith("(") and value.endswith(")") and " :> " in value):
        return None
    inner = value[1:-1]
    top = _top_level(inner)
    if top is None:
        return None
    entries = []
    for part in _split(inner, " @@ ", top):
        pieces = _split(part, " :> ", _top_level(part) or set())
        if len(pieces) != 2:
            return None
        entries.append((pieces[0].strip(), pieces[1].strip()))
    return entries


def _top_level(text: str) -> set[int] | None:
    """The indexes of ``text`` outside every bracket and string; ``None`` if its brackets do not balance."""
    top: set[int] = set()
    depth, quoted, index = 0, False, 0
    while index < len(text):
        if not quoted and depth == 0:
            top.add(index)
        if text[index] == '"':
            quoted = not quoted
        elif not quoted:
            pair = text[index : index + 2]
            if pair in _OPEN or pair in _CLOSE:
                depth += 1 if pair in _OPEN else -1
                index += 2
                continue
            if text[index] in _OPEN:
                depth += 1
            elif text[index] in _CLOSE:
                depth -= 1
            if depth < 0:
                return None
        index += 1
    return top if depth == 0 and not quoted else None


def _split(text: str, separator: str, top: set[int]) -> list[str]:
    """``text`` split at each ``separator`` that starts at a top-level index."""
    parts: list[str] = []
    start = index = 0
    while index < len(text):
        if index in top and text.startswith(separator, index):
            parts.append(text[start:index])
            index = start = index + len(separator)
            continue
        index += 1
    parts.append(text[start:])
    return parts
