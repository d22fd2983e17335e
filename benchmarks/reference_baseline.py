"""The installed reference package (``nemo-automodel``) as a same-run baseline, or ``None`` when it is missing.

The benchmarks run as scripts (``python benchmarks/bench_*.py``), so this directory is on ``sys.path``.
"""

from __future__ import annotations

import importlib
import types

PACKAGE = "nemo_automodel.components.speculative.streaming"


def streaming() -> types.ModuleType | None:
    """The reference's streaming package; prints why the reference column is skipped when it cannot be imported."""
    try:
        return importlib.import_module(PACKAGE)
    except ImportError as exc:
        print(f"(reference column skipped: {PACKAGE} is not importable: {exc}; scripts/test.sh installs it)\n")
        return None
