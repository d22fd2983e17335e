"""The control plane: tensor-free references to samples held in a feature store."""

from __future__ import annotations

import dataclasses
import enum
import re
import threading
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

import torch

from featurestream.common.errors import TensorInRef

__all__ = [
    "HIDDEN_SUPERVISION",
    "REQUIRED_FEATURES",
    "REQUIRED_SUPERVISION",
    "FeatureAlgorithm",
    "FeatureSpec",
    "SampleRef",
    "algorithm_name",
    "decoded_features",
    "fp8_features",
    "assert_no_tensors",
    "check_tensor_free",
    "declare_algorithm",
    "required_features",
    "resolve_algorithm",
]


class FeatureAlgorithm(str, enum.Enum):
    """The built-in speculative-decoding algorithms a sample's features supervise.

    A user's algorithm (registered with ``featurestream.pipeline.register_algorithm``) is named by a plain
    ``str`` instead; ``resolve_algorithm`` maps a built-in name to its member and checks any other.
    """

    EAGLE3 = "eagle3"
    DFLASH = "dflash"
    DSPARK = "dspark"
    EAGLE = "eagle"  # EAGLE-1/2 (the reference's ``eagle.target_v12``)


# The one definition of each algorithm's core (required) features, in the order batches list them. It lives in
# the control plane because every ``SampleRef`` is checked against it; the algorithm schemas in
# ``featurestream.pipeline`` (``EAGLE3_CORE_FEATURES`` ...) take their core sets from here.
REQUIRED_FEATURES: Mapping[FeatureAlgorithm, tuple[str, ...]] = MappingProxyType(
    {
        FeatureAlgorithm.EAGLE3: ("aux_hidden_states", "input_ids", "attention_mask", "loss_mask"),
        FeatureAlgorithm.DFLASH: ("hidden_states", "input_ids", "attention_mask", "loss_mask"),
        FeatureAlgorithm.DSPARK: ("target_hidden_states", "target_last_hidden_states", "input_ids", "loss_mask"),
        FeatureAlgorithm.EAGLE: (
            "input_hidden_states",
            "target_hidden_states",
            "target_logits",
            "input_ids",
            "attention_mask",
            "loss_mask",
        ),
    }
)

# The supervision a sample must carry for any consumer to train on it: alternative encodings (feature sets), one
# of which the sample holds in full. EAGLE-3: the target's full-vocabulary ``logits``, or their draft-vocabulary
# projection ``target_probs`` + ``position_mask``. A ``SampleRef`` (and so every store and queue) accepts a sample
# without it, as the reference's do (offline tools store what they like); the producer refuses to store such a
# sample and the loader dead-letters it (reason ``schema``). An algorithm absent here requires no supervision
# feature (DFlash's logits are optional, DSpark has none).
REQUIRED_SUPERVISION: Mapping[FeatureAlgorithm, tuple[tuple[str, ...], ...]] = MappingProxyType(
    {FeatureAlgorithm.EAGLE3: (("logits",), ("target_probs", "position_mask"))}
)

# The hidden-state encoding of a sample's supervision (``ref.provenance["supervision"] == "hidden"``): instead of
# the logits feature a trainer takes (first), the sample stores the target's last hidden state (second), and the
# consumer rebuilds the logits with the target's LM head, whose fingerprint ``ref.provenance["target_head"]``
# names. EAGLE-3 and DFlash store that state as a feature of its own in the logits' place; EAGLE-1/2's
# ``target_logits`` are the head over ``target_hidden_states``, which every sample carries already.
HIDDEN_SUPERVISION: Mapping[FeatureAlgorithm, tuple[str, str]] = MappingProxyType(
    {
        FeatureAlgorithm.EAGLE3: ("logits", "last_hidden_states"),
        FeatureAlgorithm.DFLASH: ("logits", "last_hidden_states"),
        FeatureAlgorithm.EAGLE: ("target_logits", "target_hidden_states"),
    }
)
# ``provenance`` keys: the supervision encoding ("logits" when absent, or "hidden") and the head's fingerprint.
SUPERVISION_KEY = "supervision"
TARGET_HEAD_KEY = "target_head"
HIDDEN = "hidden"
# ``provenance["fp8"]``: ``"<name>:<dtype>,..."``, the features stored as float8_e4m3fn, each with a float32
# ``<name>_fp8_scale [..., 1]`` (``featurestream.pipeline.fp8``); a consumer gets them back in ``<dtype>``.
FP8_KEY = "fp8"
FP8_SCALE_SUFFIX = "_fp8_scale"

# A user algorithm's name: what crosses the wire, so it is kept to a small, unambiguous alphabet.
_ALGORITHM_NAME = re.compile(r"[a-z][a-z0-9_]*(?:[.-][a-z0-9_]+)*")
_ALGORITHM_NAME_LIMIT = 64
# Core features of the user algorithms declared in this process (``declare_algorithm``), by name.
_declared: dict[str, tuple[str, ...]] = {}
_declared_lock = threading.Lock()


def resolve_algorithm(value: object) -> FeatureAlgorithm | str:
    """The built-in ``FeatureAlgorithm`` named ``value``, or ``value`` itself (a plain ``str``) when it is a
    well-formed user algorithm name (lowercase ``[a-z][a-z0-9_]*``, dot- or dash-separated parts, at most 64
    characters), whether or not this process declared it; ``ValueError`` naming ``value`` otherwise."""
    if isinstance(value, FeatureAlgorithm):
        return value
    if isinstance(value, str):
        try:
            return FeatureAlgorithm(value)
        except ValueError:
            if len(value) <= _ALGORITHM_NAME_LIMIT and _ALGORITHM_NAME.fullmatch(value):
                return str(value)  # a str subclass would carry its extra state onto the wire
    raise ValueError(
        f"{value!r} is not a FeatureAlgorithm ({[a.value for a in FeatureAlgorithm]}) nor a well-formed algorithm "
        f"name (lowercase letters, digits and '_', parts joined by '.' or '-', at most {_ALGORITHM_NAME_LIMIT} chars)"
    )


def algorithm_name(algorithm: FeatureAlgorithm | str) -> str:
    """The wire name of an algorithm: a built-in member's value, a user algorithm's name."""
    return algorithm.value if isinstance(algorithm, FeatureAlgorithm) else str(algorithm)


def declare_algorithm(name: str, required: Iterable[str]) -> str:
    """Declare a user algorithm's core features (what every ``SampleRef`` of it must name); returns the name.

    ``ValueError`` for a malformed name, a built-in name (``FeatureAlgorithm``), an empty core set, or a
    name already declared with another core set; declaring the same set again is a no-op.
    """
    resolved = resolve_algorithm(name)
    if isinstance(resolved, FeatureAlgorithm):
        raise ValueError(f"algorithm name {name!r} collides with the built-in {resolved}; choose another name")
    features = tuple(required)
    if not features or not all(isinstance(feature, str) and feature for feature in features):
        raise ValueError(f"algorithm {name!r} needs a non-empty tuple of feature names, got {features!r}")
    with _declared_lock:
        current = _declared.setdefault(resolved, features)
    if current != features:
        raise ValueError(
            f"algorithm {name!r} is already declared with core features {list(current)}, not {list(features)}"
        )
    return resolved


def required_features(algorithm: FeatureAlgorithm | str) -> tuple[str, ...] | None:
    """The core features every sample of ``algorithm`` names; ``None`` for a user algorithm not declared here."""
    if isinstance(algorithm, FeatureAlgorithm):
        return REQUIRED_FEATURES[algorithm]
    with _declared_lock:
        return _declared.get(algorithm)


_V = TypeVar("_V")

_PRIMITIVES = (str, int, float, bool, bytes, type(None))


def _is_tensor_like(obj: object) -> bool:
    if isinstance(obj, torch.Tensor):
        return True
    if type(obj).__module__ == "numpy" and type(obj).__name__ in {"ndarray", "matrix"}:
        return True
    return all(hasattr(obj, attr) for attr in ("data_ptr", "is_cuda", "numel"))


def assert_no_tensors(obj: object, *, path: str = "ref") -> None:
    """Raise ``ValueError`` naming the path of the first tensor-like value inside ``obj``.

    Walks dataclasses (their fields, then any other instance attribute, so a subclass's extra attribute is
    seen), str-keyed mappings, lists, tuples and sets; primitives pass.
    """
    _walk(obj, path, set())


def _walk(obj: object, path: str, seen: set[int]) -> None:
    if isinstance(obj, _PRIMITIVES) or isinstance(obj, (enum.Enum, torch.dtype)):
        return
    if _is_tensor_like(obj):
        raise ValueError(
            f"{path} holds a {type(obj).__name__}: a tensor-like object is not allowed in the control plane "
            "(refs must be tensor-free; tensors belong in the FeatureStore)"
        )
    if id(obj) in seen:  # a cycle: already walked
        return
    seen.add(id(obj))
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if not isinstance(key, str):
                raise ValueError(f"{path} has a non-str key {key!r}: control-plane dicts must be str-keyed")
            _walk(value, f"{path}[{key!r}]", seen)
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        for index, item in enumerate(obj):
            _walk(item, f"{path}[{index}]", seen)
        return
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = [field.name for field in dataclasses.fields(obj)]
        names += [name for name in _attributes(obj) if name not in names]
        for name in names:
            _walk(getattr(obj, name), f"{path}.{name}", seen)


def _attributes(obj: object) -> list[str]:
    """The instance attributes of ``obj``: its ``__dict__`` and every set ``__slots__`` entry."""
    names = list(getattr(obj, "__dict__", {}))
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                names.append(name)
    return names


class _FrozenDict(dict):  # type: ignore[type-arg]
    """A read-only dict: a ref's mappings cannot be changed after the ref is checked.

    A ``dict`` (not a ``MappingProxyType``) so that ``dataclasses.asdict`` and ``copy.deepcopy`` of a ref work.
    """

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("a SampleRef's feature mappings are read-only")

    __setitem__ = __delitem__ = __ior__ = _refuse  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_FrozenDict, (dict(self),))

    def __copy__(self) -> _FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> _FrozenDict:
        import copy

        return _FrozenDict(copy.deepcopy(dict(self), memo))


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """Shape and dtype of one stored feature tensor."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def __post_init__(self) -> None:
        try:
            shape = tuple(self.shape)
        except TypeError:
            raise ValueError(f"FeatureSpec shape must be a tuple of non-negative ints, got {self.shape!r}") from None
        for dim in shape:
            if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
                raise ValueError(
                    f"FeatureSpec shape must be a tuple of non-negative ints, got {shape!r} (invalid dimension {dim!r})"
                )
        if not isinstance(self.dtype, torch.dtype):
            raise ValueError(f"FeatureSpec dtype must be a torch.dtype, got {self.dtype!r}")
        object.__setattr__(self, "shape", shape)

    @property
    def nbytes(self) -> int:
        numel = 1
        for dim in self.shape:
            numel *= dim
        return numel * self.dtype.itemsize


def _refuse_tensor(value: object, path: str) -> None:
    """Name the path when a misplaced value is a tensor (the common, costly mistake)."""
    assert_no_tensors(value, path=path)


def _str_mapping(value: object, name: str, kind: type[_V]) -> dict[str, _V]:
    """Copy a str-keyed mapping whose values are all ``kind``, or raise ``ValueError``."""
    if not isinstance(value, Mapping):
        _refuse_tensor(value, f"ref.{name}")
        raise ValueError(f"SampleRef.{name} must be a mapping, got {type(value).__name__}")
    out = dict(value)
    for key, item in out.items():
        if not isinstance(key, str):
            raise ValueError(f"SampleRef.{name} has a non-str key {key!r}: control-plane dicts must be str-keyed")
        if not isinstance(item, kind):
            _refuse_tensor(item, f"ref.{name}[{key!r}]")
            raise ValueError(f"SampleRef.{name}[{key!r}] must be a {kind.__name__}, got {item!r}")
    return out


def _require_id(name: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        _refuse_tensor(value, f"ref.{name}")
        raise ValueError(f"SampleRef.{name} must be a non-empty str, got {value!r}")


def _require_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        _refuse_tensor(value, f"ref.{name}")
        raise ValueError(f"SampleRef.{name} must be a non-negative int, got {value!r}")


def fp8_features(provenance: Mapping[str, str]) -> dict[str, str]:
    """The 8-bit features ``provenance`` names, with the dtype each had: ``{name: dtype name}``."""
    listed = provenance.get(FP8_KEY)
    if not listed:
        return {}
    return dict(entry.partition(":")[::2] for entry in listed.split(","))


def _fp8_decoded(sample_id: str, specs: Mapping[str, FeatureSpec], provenance: Mapping[str, str]) -> list[str]:
    """``specs``' names without the scales of the 8-bit features; ``ValueError`` naming the sample unless each
    listed feature is float8_e4m3fn of a float dtype, beside its float32 ``[..., 1]`` scale."""
    restored = fp8_features(provenance)
    for name, dtype in restored.items():
        spec, scale = specs.get(name), specs.get(name + FP8_SCALE_SUFFIX)
        if (
            dtype not in ("float16", "bfloat16", "float32")
            or spec is None
            or spec.dtype != torch.float8_e4m3fn
            or scale is None
            or scale.dtype != torch.float32
            or scale.shape != (*spec.shape[:-1], 1)
        ):
            raise ValueError(
                f"SampleRef {sample_id!r}: provenance fp8={provenance[FP8_KEY]!r} names {name!r} as an 8-bit copy of "
                f"a {dtype} feature, which needs {name!r} float8_e4m3fn and {name + FP8_SCALE_SUFFIX!r} float32 "
                f"[..., 1]; got {spec} and {scale}"
            )
    scales = {name + FP8_SCALE_SUFFIX for name in restored}
    return [name for name in specs if name not in scales]


def decoded_features(
    sample_id: str, algorithm: FeatureAlgorithm | str, specs: Mapping[str, FeatureSpec], provenance: Mapping[str, str]
) -> list[str]:
    """The features a consumer gets of a sample stored with ``specs``: their names, less the scales of 8-bit
    features (``FP8_KEY``), and for the hidden-state encoding (``HIDDEN_SUPERVISION``) the logits feature in place of
    the extra hidden-state feature.

    ``ValueError`` naming the sample for an encoding other than ``"hidden"``, an algorithm without one, a
    hidden-encoded sample that lacks the state or the head's fingerprint, one that carries the logits too, or an
    8-bit feature without its scale.
    """
    present = _fp8_decoded(sample_id, specs, provenance)
    encoding = provenance.get(SUPERVISION_KEY)
    if encoding is None:
        return present
    encodings = HIDDEN_SUPERVISION.get(algorithm) if isinstance(algorithm, FeatureAlgorithm) else None
    if encoding != HIDDEN or encodings is None:
        raise ValueError(
            f"SampleRef {sample_id!r}: provenance supervision={encoding!r} is not an encoding of "
            f"{algorithm_name(algorithm)} (the hidden-state encoding is for {[a.value for a in HIDDEN_SUPERVISION]})"
        )
    logits, hidden = encodings
    if hidden not in present or logits in present or not provenance.get(TARGET_HEAD_KEY):
        raise ValueError(
            f"SampleRef {sample_id!r}: a hidden-state-supervised {algorithm_name(algorithm)} sample carries "
            f"{hidden!r} and no {logits!r}, with the head's fingerprint as provenance[{TARGET_HEAD_KEY!r}]; got "
            f"features {present} and provenance {dict(provenance)}"
        )
    if hidden in REQUIRED_FEATURES[algorithm]:
        return [*present, logits]
    return [logits if name == hidden else name for name in present]


@dataclasses.dataclass(frozen=True)
class SampleRef:
    """A tensor-free reference to one sample's features in a ``FeatureStore``.

    ``provenance`` (optional, str -> str) says how the features were
    encoded: ``{"supervision": "hidden", "target_head": <fingerprint>}`` for
    a sample whose logits the consumer rebuilds from the target's last
    hidden state (``HIDDEN_SUPERVISION``); empty for the reference's
    encodings.
    """

    sample_id: str
    run_id: str
    store_uri: str
    feature_keys: Mapping[str, str]
    feature_specs: Mapping[str, FeatureSpec]
    algorithm: FeatureAlgorithm | str
    schema_version: int
    num_tokens: int
    estimated_bytes: int
    target_model_version: str
    draft_weight_version: str
    provenance: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        _require_id("sample_id", self.sample_id)
        _require_id("run_id", self.run_id)
        if not isinstance(self.store_uri, str) or "://" not in self.store_uri:
            _refuse_tensor(self.store_uri, "ref.store_uri")
            raise ValueError(f"SampleRef.store_uri must look like scheme://location, got {self.store_uri!r}")
        for name in ("target_model_version", "draft_weight_version"):
            value = getattr(self, name)
            if not isinstance(value, str):
                _refuse_tensor(value, f"ref.{name}")
                raise ValueError(f"SampleRef.{name} must be a str, got {value!r}")
        try:
            algorithm = resolve_algorithm(self.algorithm)
        except ValueError as exc:
            raise ValueError(f"SampleRef.algorithm: {exc}") from None
        keys = _str_mapping(self.feature_keys, "feature_keys", str)
        specs = _str_mapping(self.feature_specs, "feature_specs", FeatureSpec)
        if set(keys) != set(specs):
            raise ValueError(
                f"SampleRef feature_keys {sorted(keys)} and feature_specs {sorted(specs)} must name the same "
                "feature set"
            )
        provenance = _str_mapping({} if self.provenance is None else self.provenance, "provenance", str)
        names = decoded_features(self.sample_id, algorithm, specs, provenance)
        # A user algorithm this process has not declared is checked by the consumer that knows it.
        required = required_features(algorithm) or ()
        missing = [name for name in required if name not in names]
        if missing:
            name = algorithm_name(algorithm)
            raise ValueError(
                f"SampleRef for {name} is missing required features {missing} (every {name} sample carries "
                f"{list(required)})"
            )
        _require_count("schema_version", self.schema_version)
        _require_count("num_tokens", self.num_tokens)
        _require_count("estimated_bytes", self.estimated_bytes)
        object.__setattr__(self, "algorithm", algorithm)
        object.__setattr__(self, "feature_keys", _FrozenDict(keys))
        object.__setattr__(self, "feature_specs", _FrozenDict(specs))
        object.__setattr__(self, "provenance", _FrozenDict(provenance))

    def __hash__(self) -> int:
        return hash((self.sample_id, self.run_id, self.store_uri))

    def feature_names(self) -> tuple[str, ...]:
        """Feature names in insertion order of ``feature_keys`` (the order batches are built in)."""
        return tuple(self.feature_keys)

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt through the constructor from plain dicts, so the copy is checked like the original.
        values = [getattr(self, f.name) for f in dataclasses.fields(self)]
        values[3] = dict(self.feature_keys)
        values[4] = dict(self.feature_specs)
        values[11] = dict(self.provenance)  # type: ignore[arg-type]
        return (SampleRef, tuple(values))


_REF_FIELDS = frozenset(field.name for field in dataclasses.fields(SampleRef))
_SPEC_FIELDS = frozenset(field.name for field in dataclasses.fields(FeatureSpec))
_REF_FIELD_COUNT = len(_REF_FIELDS)
_SPEC_FIELD_COUNT = len(_SPEC_FIELDS)


def check_tensor_free(ref: SampleRef) -> None:
    """``TypeError`` naming the path of a tensor anywhere in ``ref`` (what the queues admit).

    A plain ``SampleRef`` with plain ``FeatureSpec``s and no attribute beyond its fields was checked field by
    field when it was built, so it passes in O(features); anything else (a subclass, an extra attribute) is
    walked in full.
    """
    # Every queue put passes here. An attribute added to a ref or spec after it was built (``object.__setattr__``)
    # shows as one more entry in its ``__dict__``: counting them says so at a fraction of comparing key sets.
    if type(ref) is SampleRef and len(ref.__dict__) == _REF_FIELD_COUNT:
        for spec in ref.feature_specs.values():
            if type(spec) is not FeatureSpec or len(spec.__dict__) != _SPEC_FIELD_COUNT:
                break
        else:
            return
    try:
        assert_no_tensors(ref)
    except ValueError as exc:
        raise TensorInRef(getattr(ref, "sample_id", None), str(exc)) from None
