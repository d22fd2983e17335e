"""DOT text for the state diagrams, written by featurestream itself: DOT is text, no package is needed.

A ``Digraph`` collects statements in the order they are added and writes them
in the layout graphviz's Python package writes (one statement a line, a tab
per nesting level, the ``graph``/``node``/``edge`` defaults first), so the
committed diagrams stay byte for byte what that package would write
(``tests/tools/test_dot.py`` compares the two). IDs are quoted only where DOT
needs it: see ``quote``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

__all__ = ["Digraph", "quote"]

# A bare DOT ID: a name or a numeral. Anything else (a hyphen, a space, nothing at all) is a quoted string.
_BARE_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|-?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)")
# DOT keywords are case-insensitive; as bare IDs they would start a statement.
_KEYWORDS = frozenset({"node", "edge", "graph", "digraph", "subgraph", "strict"})
# A quote, escaped or not, after any number of escaped backslashes: the escape is added where it is missing.
_QUOTE = re.compile(r'(?P<backslashes>(?:\\\\)*)\\?"')
# An odd run of backslashes at the end would escape the closing quote.
_FINAL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\\Z")


def quote(text: str) -> str:
    r"""``text`` as a DOT ID: bare for a name (``[A-Za-z_][A-Za-z0-9_]*``) or a numeral, else double-quoted.

    A keyword (``graph``, ``node`` ... in any case) is quoted too. Inside the
    quotes every ``"`` is escaped (one escaped already stays as it is); the
    other escapes, DOT's ``\n`` and ``\l`` line breaks among them, are kept as
    written. Raises ``ValueError`` for text ending in an unpaired backslash,
    which would escape the closing quote.
    """
    if _BARE_ID.fullmatch(text) and text.lower() not in _KEYWORDS:
        return text
    if _FINAL_ESCAPE.search(text):
        raise ValueError(f"a DOT string cannot end in an unpaired backslash: {text!r}; double it or drop it")
    return '"' + _QUOTE.sub(r'\g<backslashes>\\"', text) + '"'


def _attributes(attrs: Mapping[str, str], label: str | None = None) -> str:
    """`` [label=... name=value ...]``: the label first, the rest by name; empty when there is nothing."""
    pairs = [("label", label)] if label is not None else []
    pairs += sorted(attrs.items())
    return " [" + " ".join(f"{quote(name)}={quote(value)}" for name, value in pairs) + "]" if pairs else ""


class Digraph:
    """A directed graph's DOT statements, in the order they are added.

    ``graph``, ``node`` and ``edge`` are the defaults written at the top (the
    graph's own attributes, and those every node and edge gets).
    """

    def __init__(
        self,
        name: str,
        *,
        graph: Mapping[str, str] | None = None,
        node: Mapping[str, str] | None = None,
        edge: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.defaults = {"graph": dict(graph or {}), "node": dict(node or {}), "edge": dict(edge or {})}
        self._body: list[str] = []

    def node(self, name: str, label: str | None = None, **attrs: str) -> None:
        """Add node ``name``; a bare ``name`` statement when there are no attributes."""
        self._body.append(f"{quote(name)}{_attributes(attrs, label)}")

    def edge(self, tail: str, head: str, label: str | None = None, **attrs: str) -> None:
        """Add an edge from node ``tail`` to node ``head``."""
        self._body.append(f"{quote(tail)} -> {quote(head)}{_attributes(attrs, label)}")

    def same_rank(self, name: str, nodes: tuple[str, ...]) -> None:
        """Draw ``nodes`` on one row (``rank=same``), in a subgraph ``name`` that draws nothing itself."""
        row = Digraph(name)
        row._body.append("rank=same")
        for node in nodes:
            row.node(node)
        self.subgraph(row)

    def subgraph(self, graph: Digraph) -> None:
        """Add ``graph`` as a subgraph; a name starting with ``cluster`` gets its own box and title."""
        self._body.extend(graph._lines("subgraph"))

    def _lines(self, keyword: str) -> Iterator[str]:
        yield f"{keyword} {quote(self.name)} {{"
        for kind, attrs in self.defaults.items():
            if attrs:
                yield f"\t{kind}{_attributes(attrs)}"
        for line in self._body:
            yield f"\t{line}"
        yield "}"

    @property
    def source(self) -> str:
        """The DOT text of the whole graph, each line ending in a newline."""
        return "".join(f"{line}\n" for line in self._lines("digraph"))
