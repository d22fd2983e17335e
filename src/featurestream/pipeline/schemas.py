"""The algorithm schema registry: what the producer and the loader look up instead of hard-wiring EAGLE-3.

An ``AlgorithmSchema`` says, for one ``FeatureAlgorithm``, which features a
sample carries (required and optional, in batch order), how a ref is checked
before it is materialised, how a backend's output becomes the ordered tensor
dict the store holds, which batch class a loader yields by default, and which
backend base class lets ``FeatureProducer`` infer the algorithm.

``schema_for(algorithm)`` returns the registered schema (the built-in ones are
imported on first use); ``register(schema)`` adds one.

Built-in algorithms are ``FeatureAlgorithm`` members, each with a schema module
named in ``_BUILTIN_SCHEMAS`` (``eagle3``, ``dflash``, ``dspark``, ``eagle12``):
the module registers its schema when imported. A user algorithm (MSD, ViSpec,
one's own) is registered from its own package with
``featurestream.pipeline.register_algorithm``: a name (a plain ``str``, which
travels on the wire), a batch class whose ``FEATURES`` give each feature's
dtype and shape rules, optionally a backend base class. A name that collides
with a built-in one is refused; so is a second schema for a name.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch

from featurestream.common.refs import (
    REQUIRED_FEATURES,
    FeatureAlgorithm,
    SampleRef,
    algorithm_name,
    declare_algorithm,
    resolve_algorithm,
)

__all__ = ["AlgorithmSchema", "make_batch", "register", "registered_schemas", "schema_for"]

# Schemas shipped with featurestream: imported on first lookup (each module registers its schema when imported).
_BUILTIN_SCHEMAS: Mapping[FeatureAlgorithm, str] = {
    FeatureAlgorithm.EAGLE3: "featurestream.pipeline.eagle3",
    FeatureAlgorithm.DFLASH: "featurestream.pipeline.dflash",
    FeatureAlgorithm.DSPARK: "featurestream.pipeline.dspark",
    FeatureAlgorithm.EAGLE: "featurestream.pipeline.eagle12",
}

_registry: dict[FeatureAlgorithm | str, AlgorithmSchema] = {}
_registry_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class AlgorithmSchema:
    """One algorithm's feature schema; every callable field is a plain function (not a method).

    - ``algorithm``: a ``FeatureAlgorithm`` (built-in) or a user algorithm's
      name (``featurestream.common.refs.resolve_algorithm`` checks it);
    - ``required_features``: the core features every sample has, in batch
      order (for a built-in algorithm ``REQUIRED_FEATURES[algorithm]``, the
      control plane's set; a user algorithm's are declared to the control
      plane when its schema is registered);
    - ``optional_features``: every other feature a sample may carry, in batch order;
    - ``validate_ref(ref)``: ``ValueError`` unless ``ref`` is a valid sample
      of this schema (called before materialising);
    - ``feature_tensors(batch_like)``: the schema's tensors of an object or
      mapping, validated, in schema order (``ValueError``/``TypeError``);
    - ``produced_tensors(batch_like)``: what a producer stores from its
      backend's output (may be stricter than ``feature_tensors``);
    - ``check_inputs(inputs)``: ``ValueError`` for producer inputs (a dict of
      the ``produce`` keywords, ``None`` when absent) refused before the forward;
    - ``batch_type``: the default batch class a loader yields; it has a
      ``from_tensors(mapping)`` classmethod and a ``to_trainer_inputs()`` method;
    - ``backend_type``: the base class of this algorithm's target backends
      (``FeatureProducer`` infers the algorithm from it), or ``None``;
    - ``reference_backend_type``: the dotted name (``package.module.Class``)
      of another package's backend base class that also implies this
      algorithm. featurestream never imports that package: a backend can only
      be an instance of the class once its module is imported, so the class
      is looked up in ``sys.modules``;
    - ``reference_batch_type``: the dotted name of another package's batch
      class. When its module is already imported in the loader's process,
      ``default_batch_type()`` returns a subclass of both ``batch_type`` and
      that class (see ``docs/compatibility.md``).
    """

    algorithm: FeatureAlgorithm | str
    schema_version: int
    required_features: tuple[str, ...]
    optional_features: tuple[str, ...]
    validate_ref: Callable[[SampleRef], None]
    feature_tensors: Callable[[object], dict[str, torch.Tensor]]
    produced_tensors: Callable[[object], dict[str, torch.Tensor]]
    check_inputs: Callable[[Mapping[str, torch.Tensor | None]], None]
    batch_type: type
    backend_type: type | None = None
    reference_backend_type: str | None = None
    reference_batch_type: str | None = None

    def __post_init__(self) -> None:
        algorithm = resolve_algorithm(self.algorithm)
        object.__setattr__(self, "algorithm", algorithm)
        if isinstance(self.schema_version, bool) or not isinstance(self.schema_version, int) or self.schema_version < 0:
            raise ValueError(f"schema_version must be a non-negative int, got {self.schema_version!r}")
        required, optional = tuple(self.required_features), tuple(self.optional_features)
        if not required:
            raise ValueError(f"{algorithm!r} needs at least one required feature")
        if isinstance(algorithm, FeatureAlgorithm) and set(required) != set(REQUIRED_FEATURES[algorithm]):
            raise ValueError(
                f"{algorithm!r} requires exactly {list(REQUIRED_FEATURES[algorithm])} (featurestream.common.refs."
                f"REQUIRED_FEATURES), but the schema's required_features are {list(required)}"
            )
        overlap = set(required) & set(optional)
        if overlap or len(set(optional)) != len(optional):
            raise ValueError(f"optional_features {list(optional)} repeat a name or overlap the required ones")
        object.__setattr__(self, "required_features", required)
        object.__setattr__(self, "optional_features", optional)
        for name in ("validate_ref", "feature_tensors", "produced_tensors", "check_inputs"):
            if not callable(getattr(self, name)):
                raise TypeError(f"AlgorithmSchema.{name} must be callable, got {getattr(self, name)!r}")
        for name in ("from_tensors", "to_trainer_inputs"):
            if not callable(getattr(self.batch_type, name, None)):
                raise TypeError(f"batch_type {self.batch_type.__name__} has no {name}()")
        if self.backend_type is not None and not isinstance(self.backend_type, type):
            raise TypeError(f"backend_type must be a class or None, got {self.backend_type!r}")
        for name in ("reference_backend_type", "reference_batch_type"):
            dotted = getattr(self, name)
            if dotted is not None and (not isinstance(dotted, str) or "." not in dotted.strip(".")):
                raise ValueError(f"AlgorithmSchema.{name} must be a dotted 'module.Class' name or None, got {dotted!r}")

    @property
    def feature_order(self) -> tuple[str, ...]:
        """Every feature this schema knows, in batch order: the required ones, then the optional ones."""
        return self.required_features + self.optional_features

    def make_batch(self, tensors: Mapping[str, torch.Tensor], batch_type: type | None = None) -> Any:
        """A batch of ``batch_type`` (default ``self.batch_type``) from name -> tensor; see ``make_batch``."""
        return make_batch(tensors, batch_type or self.batch_type)

    def is_backend(self, backend: object) -> bool:
        """Whether ``backend`` is one of this algorithm's target backends: an instance of ``backend_type``, or of
        ``reference_backend_type`` when that class's module is imported."""
        if self.backend_type is not None and isinstance(backend, self.backend_type):
            return True
        reference = _imported_class(self.reference_backend_type)
        return reference is not None and isinstance(backend, reference)

    def is_batch_type(self, cls: object) -> bool:
        """Whether ``cls`` is this algorithm's batch class: a subclass of ``batch_type``, or of
        ``reference_batch_type`` when that class's module is imported."""
        if not isinstance(cls, type):
            return False
        if issubclass(cls, self.batch_type):
            return True
        reference = _imported_class(self.reference_batch_type)
        return reference is not None and issubclass(cls, reference)

    def default_batch_type(self) -> type:
        """The class a loader builds batches as when it is given none.

        ``batch_type``, unless the module of ``reference_batch_type`` is already
        imported in this process (a recipe written for that package runs here):
        then a subclass of both, so the recipe's ``isinstance`` checks against
        its own class pass and featurestream's methods stay available.
        """
        reference = _imported_class(self.reference_batch_type)
        if reference is None or issubclass(self.batch_type, reference):
            return self.batch_type
        return _batch_type_of_both(self.batch_type, reference)


def _imported_class(dotted: str | None) -> type | None:
    """The class named ``package.module.Class`` if its module is already imported (never importing it), else None."""
    if dotted is None:
        return None
    module_name, _, name = dotted.rpartition(".")
    module = sys.modules.get(module_name)
    found = getattr(module, name, None) if module is not None else None
    return found if isinstance(found, type) else None


@functools.cache
def _batch_type_of_both(own: type, reference: type) -> type:
    """One class per pair, so batches of two loaders are of the same type."""

    def __reduce__(self: Any) -> tuple[Any, ...]:
        # Pickled as its two bases (both importable by name) and its fields: the combined class is rebuilt on load.
        return _rebuild_batch, (own, reference, dict(vars(self)))

    return type(
        own.__name__,
        (own, reference),
        {
            "__module__": own.__module__,
            "__doc__": f"A {own.__qualname__} that is also a {reference.__module__}.{reference.__qualname__}.",
            "__reduce__": __reduce__,
        },
    )


def _rebuild_batch(own: type, reference: type, fields: dict[str, Any]) -> Any:
    return _batch_type_of_both(own, reference)(**fields)


def make_batch(tensors: Mapping[str, torch.Tensor], batch_type: type) -> Any:
    """Build ``batch_type`` from ``tensors``: through its ``from_tensors`` classmethod when it has one.

    A recipe's own batch class (the reference's ``Eagle3TargetBatch``, say: a
    dataclass whose fields are the feature names, optional ones defaulting to
    ``None``) has no ``from_tensors``; it is built with the tensors as keywords.
    """
    from_tensors = getattr(batch_type, "from_tensors", None)
    if callable(from_tensors):
        return from_tensors(tensors)
    return batch_type(**tensors)


def register(schema: AlgorithmSchema) -> AlgorithmSchema:
    """Make ``schema`` the one for its algorithm; ``ValueError`` if another is registered for it already
    (a user schema for a built-in algorithm included: the built-in one is loaded first).

    Registering the same schema object again, or one declared again from the same batch class with the same
    options (``register_algorithm`` run twice: a module imported twice, a notebook cell run again), is a no-op
    returning the registered schema. A user algorithm's core features are declared to the control plane
    (``declare_algorithm``), so every ``SampleRef`` of it is checked.
    """
    if not isinstance(schema, AlgorithmSchema):
        raise TypeError(f"register expects an AlgorithmSchema, got {type(schema).__name__}")
    builtin = _BUILTIN_SCHEMAS.get(schema.algorithm) if isinstance(schema.algorithm, FeatureAlgorithm) else None
    if builtin is not None:
        importlib.import_module(builtin)  # while that module registers its own schema this returns at once
    with _registry_lock:
        current = _registry.get(schema.algorithm)
        if current is not None and _same_declaration(current, schema):
            return current
        if current is not None:
            what = "the built-in" if builtin is not None else "a"
            raise ValueError(
                f"{what} schema for {schema.algorithm!r} is already registered; there is one per algorithm "
                "(register yours under another name)"
            )
        if not isinstance(schema.algorithm, FeatureAlgorithm):
            declare_algorithm(schema.algorithm, schema.required_features)
        _registry[schema.algorithm] = schema
    return schema


def _same_declaration(current: AlgorithmSchema, schema: AlgorithmSchema) -> bool:
    """Whether ``schema`` declares ``current`` again: the very object, or the same batch class, backend class,
    version and input check (``declare_schema`` builds a new schema object on each call)."""
    return current is schema or (
        current.batch_type is schema.batch_type
        and current.backend_type is schema.backend_type
        and current.schema_version == schema.schema_version
        and current.check_inputs is schema.check_inputs
        and (current.reference_backend_type, current.reference_batch_type)
        == (schema.reference_backend_type, schema.reference_batch_type)
    )


def unregistered_message(algorithm: FeatureAlgorithm | str) -> str:
    """Why ``algorithm`` has no schema in this process, and how it gets one."""
    registered = ", ".join(sorted(algorithm_name(name) for name in registered_schemas())) or "none"
    return (
        f"no feature schema is registered for algorithm {algorithm_name(algorithm)!r} in this process "
        f"(registered: {registered}); register it before consuming its samples: import the module that calls "
        "featurestream.pipeline.register_algorithm(...) for it (see featurestream.pipeline.schemas)"
    )


def schema_for(algorithm: FeatureAlgorithm | str) -> AlgorithmSchema:
    """The registered schema of ``algorithm``; ``ValueError`` naming it, the registered ones and how to register
    when there is none."""
    resolved = resolve_algorithm(algorithm)
    schemas = registered_schemas()
    if resolved not in schemas:
        raise ValueError(unregistered_message(resolved))
    return schemas[resolved]


def registered_schemas() -> dict[FeatureAlgorithm | str, AlgorithmSchema]:
    """Every registered schema by algorithm, the built-in ones included (imported here if not yet)."""
    for module in _BUILTIN_SCHEMAS.values():
        importlib.import_module(module)  # registers on first import; a no-op afterwards
    with _registry_lock:
        return dict(_registry)
