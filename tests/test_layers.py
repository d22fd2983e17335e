"""Import layering: the queue core never reaches the tools, and the testing kit's mixins never import their host."""

from __future__ import annotations

import ast
import pathlib

import pytest

import featurestream
from featurestream import LocalFeatureStore, SampleRefQueue

PACKAGE = pathlib.Path(featurestream.__file__).parent


def imported(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside functions (lazy imports count too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", ["core", "backends"])
def test_the_queue_layers_import_nothing_from_the_tools(layer: str) -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(n for n in imported(path) if n.startswith("featurestream.tools"))
        for path in (PACKAGE / layer).rglob("*.py")
    }
    assert not {path: names for path, names in offenders.items() if names}


def test_queues_have_no_render_method_and_the_root_exports_render_queue() -> None:
    from featurestream.tools.diagrams import render_queue

    assert featurestream.render_queue is render_queue and "render_queue" in featurestream.__all__
    assert not hasattr(SampleRefQueue(LocalFeatureStore()), "render")


def test_the_kit_invariants_do_not_import_the_machine_they_are_mixed_into() -> None:
    modules = imported(PACKAGE / "testing" / "invariants.py")
    assert "featurestream.testing.machine" not in modules and "featurestream.testing.rules" not in modules


def test_a_host_lacking_what_the_invariants_read_is_refused_by_name() -> None:
    from featurestream.testing.invariants import QueueInvariants

    class Bare(QueueInvariants):
        queue = None

    with pytest.raises(TypeError, match=r"Bare cannot host QueueInvariants: it lacks store, inner, .*_sync_store"):
        Bare()._init_invariants()
