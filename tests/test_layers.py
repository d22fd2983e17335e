"""Import layering: layers point down (the queue core never reaches the tools, the data plane never the control plane),
no module takes another package's private names, and the testing kit's mixins never import their host."""

from __future__ import annotations

import ast
import pathlib

import pytest

import featurestream
from featurestream import LocalFeatureStore, SampleRefQueue

PACKAGE = pathlib.Path(featurestream.__file__).parent


def package_of(path: pathlib.Path) -> str:
    """``featurestream.<first folder>`` for a module in a subpackage, the module itself for a top-level one."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return "featurestream." + parts[0]


def private_imports(source: str, own: str) -> list[str]:
    """``module.name`` for every ``from featurestream... import _name`` in ``source`` whose module lies in another
    package than ``own`` (dunder names are no private names)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("featurestream."):
            if node.module == own or node.module.startswith(own + "."):
                continue
            found += [
                f"{node.module}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    return found


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


def test_the_data_plane_imports_nothing_from_the_control_plane() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(n for n in imported(path) if n.startswith("featurestream.core"))
        for path in (PACKAGE / "stores").rglob("*.py")
    }
    assert not {path: names for path, names in offenders.items() if names}


def test_the_shared_vocabulary_imports_no_other_featurestream_package() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            n for n in imported(path) if n.startswith("featurestream.") and not n.startswith("featurestream.common")
        )
        for path in (PACKAGE / "common").rglob("*.py")
    }
    assert offenders and not {path: names for path, names in offenders.items() if names}


REFERENCE_PATHS = {"refs", "store", "queue", "eagle3", "producer", "loader", "async_pipeline", "redis_queue", "hf"}


def aliased_modules() -> set[str]:
    """Every module of the package that replaces itself in ``sys.modules`` with another module."""
    return {
        str(path.relative_to(PACKAGE).with_suffix(""))
        for path in PACKAGE.rglob("*.py")
        if "sys.modules[__name__]" in path.read_text()
    }


def test_the_only_aliases_are_the_nine_reference_paths() -> None:
    # One path per module: an old home of a moved module is deleted, not aliased; only the reference's
    # import paths, which recipes use, stay.
    assert aliased_modules() == REFERENCE_PATHS


def test_the_alias_check_catches_an_alias_of_an_own_module(tmp_path: pathlib.Path, monkeypatch) -> None:
    fake = tmp_path / "featurestream"
    (fake / "core").mkdir(parents=True)
    (fake / "core" / "refs.py").write_text("import sys\nsys.modules[__name__] = sys\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", fake)
    assert aliased_modules() == {"core/refs"}


def test_no_module_imports_a_private_name_of_another_package() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): private_imports(path.read_text(), package_of(path))
        for path in PACKAGE.rglob("*.py")
    }
    assert not {path: names for path, names in offenders.items() if names}


def test_the_private_name_check_sees_a_cross_package_import_and_allows_its_own_package() -> None:
    # The check above passes on an empty result, so show it would see an offender.
    source = "from featurestream.pipeline.batching import _cap\nfrom featurestream.testing.x import _y, __all__\n"
    assert package_of(PACKAGE / "testing" / "machine.py") == "featurestream.testing"
    assert private_imports(source, "featurestream.testing") == ["featurestream.pipeline.batching._cap"]


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
