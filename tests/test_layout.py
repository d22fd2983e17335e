"""The package layout's promises: reference paths still import, the root is lazy, the CLI stays torch-free."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest

import featurestream

# Reference module path -> where the code lives now.
ALIASES = {
    "featurestream.refs": "featurestream.common.refs",
    "featurestream.store": "featurestream.stores.base",
    "featurestream.queue": "featurestream.backends.memory.queue",
    "featurestream.eagle3": "featurestream.pipeline.eagle3",
    "featurestream.producer": "featurestream.pipeline.producer",
    "featurestream.loader": "featurestream.pipeline.loader",
    "featurestream.async_pipeline": "featurestream.pipeline.async_pipeline",
    "featurestream.redis_queue": "featurestream.backends.redis.queue",
    "featurestream.hf": "featurestream.pipeline.hf",
}


@pytest.mark.parametrize(("alias", "home"), sorted(ALIASES.items()))
def test_reference_path_is_the_same_module(alias: str, home: str) -> None:
    assert importlib.import_module(alias) is importlib.import_module(home)


def test_cli_commands_name_modules_that_exist() -> None:
    from featurestream.cli import COMMANDS

    for module, _ in COMMANDS.values():
        assert importlib.util.find_spec(module) is not None, module


def test_stores_keep_their_reference_paths() -> None:
    from featurestream.stores.local import LocalFeatureStore
    from featurestream.stores.shared_dir import SharedDirFeatureStore

    assert LocalFeatureStore.__module__ == "featurestream.stores.local"
    assert SharedDirFeatureStore.__module__ == "featurestream.stores.shared_dir"


@pytest.mark.parametrize("name", featurestream.__all__)
def test_every_root_export_resolves(name: str) -> None:
    value = getattr(featurestream, name)
    assert getattr(value, "__name__", name) == name


def test_root_all_matches_the_lazy_table() -> None:
    assert sorted(featurestream.__all__) == sorted(featurestream._EXPORTS)


def test_unknown_root_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        featurestream.NoSuchThing  # noqa: B018


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return set(out.split())


def test_package_import_loads_no_torch() -> None:
    assert "torch" not in _modules_after("import featurestream")


def test_cli_help_loads_no_torch() -> None:
    code = "from featurestream.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass"
    assert "torch" not in _modules_after(code)


def test_cli_diagrams_dot_loads_no_torch(tmp_path: object) -> None:
    code = f"from featurestream.cli import main\nmain(['diagrams', '--format', 'dot', '--out', {str(tmp_path)!r}])"
    modules = _modules_after(code)
    assert "torch" not in modules
    assert "featurestream.tools.diagrams" in modules  # the command really ran


def test_queue_does_load_torch_through_refs() -> None:
    # The control check: the probe above can see torch when it is imported.
    assert "torch" in _modules_after("import featurestream.queue")
