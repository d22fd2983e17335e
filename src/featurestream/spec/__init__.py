"""The formal side of featurestream: the TLA+ spec's Python mirror, TLC runner and trace validation.

- ``mirror``: ``SpecMirror``, the spec's variables and actions in pure Python (step API + BFS).
- ``tlc``: find Java and ``tla2tools.jar``, run TLC, parse its verdict.
- ``trace``: render an implementation trace as a TLA+ module and have TLC validate it.
- ``check``: the ``featurestream check`` subcommand.
"""

from __future__ import annotations
