"""Declarative feature schemas: per-feature dtype and shape rules, checked at put and at get.

A ``FeatureRule`` says what one feature may hold: its dtypes (kinds such as
``"floating"`` or exact ``torch.dtype`` values) and its shape as a tuple of
dimensions, each an ``int`` (that size exactly), a letter (a size shared by
every feature of the sample that names the same letter: ``"B"`` batch, ``"S"``
sequence ...) or ``"*"`` (any size). ``FeatureSet`` checks a sample's feature
names (required, optional, what each optional one requires) and its specs
against the rules; the same check runs on tensors (the producer's put) and on
a ref's ``feature_specs`` (the loader, before it materialises a sample).

``FeatureBatch`` is the base of batch classes whose fields are the features
(DFlash, DSpark, EAGLE-1/2, a user's own) and whose ``FEATURES`` is their
``FeatureSet``; ``declare_schema`` registers the ``AlgorithmSchema`` of such
a class (the built-in modules), ``register_algorithm`` does so for a user
algorithm under its own name.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, Generic, TypeVar

import torch

from featurestream.common.refs import FeatureAlgorithm, SampleRef, algorithm_name, resolve_algorithm
from featurestream.pipeline.schemas import AlgorithmSchema, register

__all__ = [
    "DTYPE_KINDS",
    "ATTENTION_MASK_RULE",
    "INPUT_IDS_RULE",
    "LOSS_MASK_RULE",
    "MASK_DTYPES",
    "PACKING_RULES",
    "FeatureBatch",
    "FeatureRule",
    "FeatureSet",
    "ForwardInputs",
    "TargetBackendBase",
    "TargetInputs",
    "declare_schema",
    "register_algorithm",
]

# What a dtype kind admits; a rule may also name exact dtypes.
DTYPE_KINDS: Mapping[str, frozenset[torch.dtype]] = {
    "floating": frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64}),
    "integer": frozenset({torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}),
    "bool": frozenset({torch.bool}),
}
_ANY_SIZE = "*"
# A mask may be bool, integer or floating (HF collators differ; a float loss mask may weight tokens).
MASK_DTYPES = ("bool", "integer", "floating")


def _shape_text(shape: Sequence[object]) -> str:
    return f"[{', '.join(str(dim) for dim in shape)}]"


@dataclasses.dataclass(frozen=True)
class FeatureRule:
    """One feature's rule: its name, admitted dtypes, shape pattern, whether required, what it requires.

    ``dtypes`` holds kinds (keys of ``DTYPE_KINDS``) and/or ``torch.dtype``
    values; ``shape`` holds ``int`` sizes, one-letter-or-longer symbolic names
    (``"B"``, ``"S"``: equal wherever they appear in one sample) and ``"*"``;
    ``requires`` names the optional features that must come with this one.
    ``ValueError``/``TypeError`` for a malformed rule.
    """

    name: str
    dtypes: tuple[str | torch.dtype, ...]
    shape: tuple[int | str, ...]
    required: bool = True
    requires: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"FeatureRule name must be an identifier, got {self.name!r}")
        dtypes = tuple(self.dtypes) if not isinstance(self.dtypes, (str, torch.dtype)) else (self.dtypes,)
        if not dtypes:
            raise ValueError(f"FeatureRule {self.name!r} admits no dtype")
        for dtype in dtypes:
            if not isinstance(dtype, torch.dtype) and dtype not in DTYPE_KINDS:
                raise ValueError(
                    f"FeatureRule {self.name!r}: dtype {dtype!r} is neither a torch.dtype nor a kind "
                    f"{sorted(DTYPE_KINDS)}"
                )
        shape = tuple(self.shape)
        for dim in shape:
            valid_int = isinstance(dim, int) and not isinstance(dim, bool) and dim >= 0
            if not valid_int and not (isinstance(dim, str) and dim and (dim == _ANY_SIZE or dim.isidentifier())):
                raise ValueError(
                    f"FeatureRule {self.name!r}: shape {shape!r} has dimension {dim!r}; use non-negative ints, "
                    f"symbolic names such as 'B' or 'S', or {_ANY_SIZE!r}"
                )
        if not isinstance(self.required, bool):
            raise TypeError(f"FeatureRule {self.name!r}: required must be a bool, got {self.required!r}")
        requires = (self.requires,) if isinstance(self.requires, str) else tuple(self.requires)
        object.__setattr__(self, "dtypes", dtypes)
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "requires", requires)
        admitted: set[torch.dtype] = set()
        for dtype in dtypes:
            admitted |= {dtype} if isinstance(dtype, torch.dtype) else DTYPE_KINDS[dtype]
        # Derived once (no argument): every put and every get of a sample checks it.
        object.__setattr__(self, "admitted", frozenset(admitted))

    admitted: frozenset[torch.dtype] = dataclasses.field(init=False, repr=False, compare=False)

    def describe(self) -> str:
        kinds = "/".join(str(dtype).removeprefix("torch.") for dtype in self.dtypes)
        return f"{_shape_text(self.shape)} of {kinds}"


# The token inputs every algorithm's batch carries: ``input_ids [B, S]`` integer and the two masks ``[B, S]`` of any
# mask dtype (each algorithm lists the ones its reference batch has).
INPUT_IDS_RULE = FeatureRule("input_ids", ("integer",), ("B", "S"))
ATTENTION_MASK_RULE = FeatureRule("attention_mask", MASK_DTYPES, ("B", "S"))
LOSS_MASK_RULE = FeatureRule("loss_mask", MASK_DTYPES, ("B", "S"))

# The packing metadata the reference's DFlash, DSpark and EAGLE-1/2 batches carry, unshifted: per-document
# ``position_ids [B, S]``, document lengths ``seq_lens [B, D]`` and ``doc_remaining [B, S]``. A packed batch
# (``seq_lens``) needs the other two, as the reference's trainers require.
PACKING_RULES: tuple[FeatureRule, ...] = (
    FeatureRule("position_ids", ("integer",), ("B", "S"), required=False),
    FeatureRule("seq_lens", ("integer",), ("B", "*"), required=False, requires=("position_ids", "doc_remaining")),
    FeatureRule("doc_remaining", ("integer",), ("B", "S"), required=False),
)


class FeatureSet:
    """An algorithm's features in batch order, with the checks every sample of it passes.

    ``label`` names the algorithm in errors. ``ValueError`` for repeated
    names, or a ``requires`` naming an unknown or required feature.
    """

    def __init__(self, label: str, rules: Iterable[FeatureRule]) -> None:
        self.label = label
        self.rules: tuple[FeatureRule, ...] = tuple(rules)
        for rule in self.rules:
            if not isinstance(rule, FeatureRule):
                raise TypeError(f"{label} features must be FeatureRule objects, got {rule!r}")
        self.order = tuple(rule.name for rule in self.rules)
        if len(set(self.order)) != len(self.order):
            raise ValueError(f"{label} features repeat a name: {list(self.order)}")
        self.by_name = {rule.name: rule for rule in self.rules}
        self.required = tuple(rule.name for rule in self.rules if rule.required)
        self.optional = tuple(rule.name for rule in self.rules if not rule.required)
        for rule in self.rules:
            for other in rule.requires:
                if other not in self.by_name or other == rule.name:
                    raise ValueError(f"{label} feature {rule.name!r} requires {other!r}, which is not another feature")

    def check_names(self, names: Iterable[str]) -> None:
        """``ValueError`` unless ``names`` has every required feature, no unknown one, and what each requires."""
        present = set(names)
        missing = [name for name in self.required if name not in present]
        if missing:
            raise ValueError(f"{self.label} sample is missing required features {missing}")
        unknown = present - set(self.order)
        if unknown:
            raise ValueError(f"{self.label} has no features {sorted(unknown)} (known: {list(self.order)})")
        for name in self.order:
            rule = self.by_name[name]
            lacking = [other for other in rule.requires if other not in present]
            if name in present and lacking:
                raise ValueError(f"{self.label} feature {name!r} needs {list(rule.requires)} with it; {lacking} absent")

    def check_specs(self, specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]], sample: str | None) -> None:
        """``ValueError`` naming the sample, the feature, what was expected and what came, for the first feature
        (in batch order) whose dtype or shape breaks its rule; symbolic dimensions must agree across features."""
        where = f"sample {sample!r}: " if sample is not None else ""
        bound: dict[str, tuple[int, str]] = {}
        for name in self.order:
            if name not in specs:
                continue
            shape, dtype = specs[name]
            rule = self.by_name[name]
            if dtype not in rule.admitted:
                raise ValueError(
                    f"{where}{self.label} feature {name!r} expected dtype {rule.describe()}, got {dtype} "
                    f"(shape {_shape_text(shape)})"
                )
            if len(shape) != len(rule.shape):
                raise ValueError(
                    f"{where}{self.label} feature {name!r} expected shape {rule.describe()}, got {_shape_text(shape)}"
                )
            for axis, (want, size) in enumerate(zip(rule.shape, shape, strict=True)):
                if isinstance(want, int) and size != want:
                    raise ValueError(
                        f"{where}{self.label} feature {name!r} expected shape {rule.describe()}, got "
                        f"{_shape_text(shape)} (dimension {axis} must be {want})"
                    )
                if isinstance(want, str) and want != _ANY_SIZE:
                    seen = bound.setdefault(want, (size, name))
                    if seen[0] != size:
                        raise ValueError(
                            f"{where}{self.label} feature {name!r} expected shape {rule.describe()} with {want}="
                            f"{seen[0]} (as in {seen[1]!r}), got {_shape_text(shape)}"
                        )

    def tensors_of(self, batch: object, sample: str | None = None) -> dict[str, torch.Tensor]:
        """The features of ``batch`` (attributes or a mapping; ``None`` means absent), checked, in batch order."""
        tensors = self.present(batch, sample)
        self.check_specs({name: (tuple(t.shape), t.dtype) for name, t in tensors.items()}, sample)
        return tensors

    def present(self, batch: object, sample: str | None = None) -> dict[str, torch.Tensor]:
        """``tensors_of`` without the dtype and shape rules: the features present, each a tensor, their names
        checked (``check_names``)."""
        if isinstance(batch, Mapping):
            found = {name: batch.get(name) for name in self.order}
        else:
            found = {name: getattr(batch, name, None) for name in self.order}
        tensors = {name: value for name, value in found.items() if value is not None}
        for name, value in tensors.items():
            if not isinstance(value, torch.Tensor):
                where = f"sample {sample!r}: " if sample is not None else ""
                raise TypeError(
                    f"{where}{self.label} feature {name!r} must be a torch.Tensor, got {type(value).__name__}"
                )
        self.check_names(tensors)
        return tensors

    def check_ref(self, ref: SampleRef, algorithm: FeatureAlgorithm | str, schema_version: int) -> None:
        """``ValueError`` unless ``ref`` is a sample of this algorithm and version whose specs pass the rules."""
        if ref.algorithm != algorithm:
            raise ValueError(
                f"sample {ref.sample_id!r}: ref.algorithm must be {algorithm_name(algorithm)!r} (got "
                f"{algorithm_name(ref.algorithm)!r}) for a {self.label} consumer; route it to a consumer of its "
                "algorithm"
            )
        self.check_ref_features(ref, schema_version)

    def check_ref_features(self, ref: SampleRef, schema_version: int) -> None:
        """``check_ref`` past the algorithm (which an algorithm with its own wording checks first): ``ValueError``
        unless ``ref`` has ``schema_version`` and feature names and specs that pass the rules. A feature this set
        does not name is not checked (a recipe's own, which the reference's loader passes over too)."""
        if ref.schema_version != schema_version:
            raise ValueError(
                f"sample {ref.sample_id!r}: {self.label} schema_version must be {schema_version}, got "
                f"{ref.schema_version}"
            )
        try:
            self.check_names(name for name in ref.feature_keys if name in self.by_name)
        except ValueError as exc:
            raise ValueError(f"sample {ref.sample_id!r}: {exc}") from None
        self.check_specs({name: (spec.shape, spec.dtype) for name, spec in ref.feature_specs.items()}, ref.sample_id)


class FeatureBatch:
    """Base of a dataclass batch whose fields are an algorithm's features (absent optional ones ``None``).

    A subclass sets ``FEATURES`` (its ``FeatureSet``), optionally
    ``TRAINER_KEYWORDS`` (feature -> the trainer's keyword) and
    ``TRAINER_SKIPS`` (features the trainer's forward does not take). The
    batch is checked on construction (``ValueError``/``TypeError``); features
    read as attributes or by name, so code written for a plain ``dict`` batch
    keeps working.
    """

    FEATURES: ClassVar[FeatureSet]
    TRAINER_KEYWORDS: ClassVar[Mapping[str, str]] = MappingProxyType({})
    TRAINER_SKIPS: ClassVar[frozenset[str]] = frozenset()

    def __post_init__(self) -> None:
        self.FEATURES.tensors_of(self)

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor]) -> Any:
        """Build a batch from name -> tensor; ``ValueError`` for names outside the schema."""
        cls.FEATURES.check_names(tensors)
        return cls(**tensors)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The features present, in schema order."""
        return self.FEATURES.tensors_of(self)

    def to_trainer_inputs(self) -> dict[str, torch.Tensor]:
        """The trainer's forward keywords: the features present, renamed as the trainer takes them."""
        return {
            self.TRAINER_KEYWORDS.get(name, name): tensor
            for name, tensor in self.tensors().items()
            if name not in self.TRAINER_SKIPS
        }

    def __getitem__(self, name: str) -> torch.Tensor:
        value = getattr(self, name, None) if name in self.FEATURES.by_name else None
        if value is None:
            raise KeyError(name)
        return value  # type: ignore[no-any-return]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.FEATURES.by_name and getattr(self, name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors())

    def keys(self) -> list[str]:
        return list(self.tensors())


@dataclasses.dataclass(frozen=True)
class ForwardInputs:
    """What a target model's forward sees of a batch (``loss_mask`` and ``doc_remaining`` never reach it): the
    tokens, their attention mask and, for a packed batch, the per-document ``position_ids`` and the document lengths
    ``seq_lens``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None


_Batch = TypeVar("_Batch")


@dataclasses.dataclass(frozen=True)
class TargetInputs(ForwardInputs):
    """The six arguments of one ``generate_batch`` call as one value: the ``ForwardInputs`` (what the forward
    reads) and, keyword-only, the ``loss_mask`` and ``doc_remaining`` the batch carries past it."""

    loss_mask: torch.Tensor = dataclasses.field(kw_only=True)
    doc_remaining: torch.Tensor | None = dataclasses.field(default=None, kw_only=True)

    def batch(self, batch_type: type[_Batch], /, **features: torch.Tensor | None) -> _Batch:
        """``batch_type(**features)`` (a dataclass batch), each input it has a field for passed through as it came
        unless ``features`` gives that field (a shifted ``input_ids`` ...)."""
        passed = {name: getattr(self, name) for name in _passed_inputs(batch_type) if name not in features}
        return batch_type(**passed, **features)


_INPUT_NAMES = tuple(field.name for field in dataclasses.fields(TargetInputs))


@functools.cache
def _passed_inputs(batch_type: type) -> tuple[str, ...]:
    """The inputs ``batch_type`` has fields for (read once per batch class: every forward builds a batch)."""
    fields = {field.name for field in dataclasses.fields(batch_type)}
    return tuple(name for name in _INPUT_NAMES if name in fields)


class _TargetBackendMeta(abc.ABCMeta):
    """``ABCMeta`` where ``generate_batch`` and ``target_batch`` are one method in either of two forms.

    A class that writes ``generate_batch`` itself (the reference's form)
    owes no ``target_batch``; one whose ``generate_batch`` is still
    ``TargetBackendBase``'s (which calls ``target_batch``) owes
    ``target_batch``, and while it lacks it lists both as abstract, so the
    ``TypeError`` on instantiation names the method a reader knows.
    """

    def __new__(
        mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], /, **kwargs: Any
    ) -> _TargetBackendMeta:
        cls = super().__new__(mcls, name, bases, namespace, **kwargs)
        abstract = cls.__abstractmethods__
        if "target_batch" in abstract:
            owner = next(klass for klass in cls.__mro__ if "generate_batch" in vars(klass))
            # Only TargetBackendBase declares target_batch beside the generate_batch that calls it.
            bundled = "target_batch" in vars(owner)
            cls.__abstractmethods__ = abstract | {"generate_batch"} if bundled else abstract - {"target_batch"}
        return cls


class TargetBackendBase(abc.ABC, Generic[_Batch], metaclass=_TargetBackendMeta):
    """A target model an algorithm's producer drives: one no-grad forward per ``generate_batch``.

    Each algorithm's backend base class (``DFlashTargetBackend`` ...) derives
    from this; ``FeatureProducer`` infers the algorithm from it. A backend
    implements ``generate_batch`` itself (the reference's form) or
    ``target_batch``, which this class's ``generate_batch`` calls with the
    arguments in one ``TargetInputs``; a class with neither cannot be
    instantiated (``TypeError``). Parametrised by the batch class both return
    (``TargetBackendBase[DFlashTargetBatch]``), so a type checker knows it.
    """

    def generate_batch(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        doc_remaining: torch.Tensor | None = None,
    ) -> _Batch:
        """One forward over the batch, returning the algorithm's batch (fresh tensors); packing metadata is
        passed through. ``FeatureProducer`` passes every argument by keyword."""
        inputs = TargetInputs(
            input_ids, attention_mask, position_ids, seq_lens, loss_mask=loss_mask, doc_remaining=doc_remaining
        )
        return self.target_batch(inputs)

    @abc.abstractmethod
    def target_batch(self, inputs: TargetInputs) -> _Batch:
        """What ``generate_batch`` returns for ``inputs``: the algorithm's batch (``inputs.batch`` builds it with
        the inputs passed through)."""
        # Reached only on a class that writes generate_batch itself (the metaclass then owes no target_batch).
        raise NotImplementedError(f"{type(self).__name__} implements generate_batch itself, not target_batch")

    def get_input_embeddings(self) -> torch.nn.Module:
        """The target's input embedding (a draft head may share it)."""
        raise NotImplementedError(f"{type(self).__name__} does not expose its input embeddings")


def _no_input_check(inputs: Mapping[str, torch.Tensor | None]) -> None:
    """Producer inputs a declared schema refuses before the forward: none (its backend's output is checked)."""


def declare_schema(
    algorithm: FeatureAlgorithm | str,
    batch_type: type[FeatureBatch],
    *,
    schema_version: int = 1,
    backend_type: type | None = None,
    reference_backend_type: str | None = None,
    reference_batch_type: str | None = None,
) -> AlgorithmSchema:
    """Register and return the ``AlgorithmSchema`` of ``batch_type.FEATURES``: refs checked by name, dtype and
    shape before a sample is materialised, a producer's output checked likewise before it is stored."""
    if not (isinstance(batch_type, type) and issubclass(batch_type, FeatureBatch)):
        raise TypeError(f"batch_type must be a FeatureBatch subclass, got {batch_type!r}")
    features = getattr(batch_type, "FEATURES", None)
    if not isinstance(features, FeatureSet):
        raise TypeError(f"{batch_type.__name__}.FEATURES must be a FeatureSet, got {features!r}")
    fields = (
        tuple(field.name for field in dataclasses.fields(batch_type)) if dataclasses.is_dataclass(batch_type) else ()
    )
    if fields != features.order:
        raise TypeError(
            f"{batch_type.__name__} must be a dataclass whose fields are its FEATURES in order {list(features.order)}, "
            f"got {list(fields)}"
        )

    def validate_ref(ref: SampleRef) -> None:
        features.check_ref(ref, schema.algorithm, schema_version)

    schema = AlgorithmSchema(
        algorithm=algorithm,
        schema_version=schema_version,
        required_features=features.required,
        optional_features=features.optional,
        validate_ref=validate_ref,
        feature_tensors=features.tensors_of,
        produced_tensors=features.tensors_of,
        check_inputs=_no_input_check,
        batch_type=batch_type,
        backend_type=backend_type,
        reference_backend_type=reference_backend_type,
        reference_batch_type=reference_batch_type,
    )
    return register(schema)


def register_algorithm(
    name: str, batch_type: type[FeatureBatch], *, backend_type: type | None = None, schema_version: int = 1
) -> AlgorithmSchema:
    """Register a user algorithm from outside featurestream; returns its schema.

    ``name`` is what travels on the wire (lowercase, see
    ``featurestream.common.refs.resolve_algorithm``); ``batch_type`` is a
    dataclass subclassing ``FeatureBatch`` whose fields are its ``FEATURES``
    (a ``FeatureSet`` of ``FeatureRule``s: each feature's dtypes and shape
    pattern, required or optional) in order; ``backend_type``, when given, lets
    ``FeatureProducer`` infer the algorithm from a backend's class. Every
    process that produces or consumes the algorithm's samples must register
    it (import the module that does so). ``ValueError`` for a malformed name,
    a built-in name, or a name already registered with another schema;
    ``TypeError`` for a batch class that is not as described.
    """
    resolved = resolve_algorithm(name)
    if isinstance(resolved, FeatureAlgorithm):
        raise ValueError(f"algorithm name {name!r} collides with the built-in {resolved}; choose another name")
    if backend_type is not None and not isinstance(backend_type, type):
        raise TypeError(f"backend_type must be a class or None, got {backend_type!r}")
    return declare_schema(resolved, batch_type, schema_version=schema_version, backend_type=backend_type)
