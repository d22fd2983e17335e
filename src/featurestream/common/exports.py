"""Lazy package exports (PEP 562): a public name's module is imported on first access, not with the package.

``featurestream`` and ``featurestream.pipeline`` export their names this way, so importing the package (or one
pipeline module) does not import torch or the other modules.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, namespace: MutableMapping[str, object], exports: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``, whose globals are ``namespace``.

    ``__getattr__(name)`` imports the module ``exports[name]`` names, returns its ``name`` and caches it in
    ``namespace`` (so later lookups skip ``__getattr__``); a name ``exports`` lacks is an ``AttributeError``
    naming ``package`` and the name. ``__dir__()`` lists the globals and every export, sorted.
    """

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
