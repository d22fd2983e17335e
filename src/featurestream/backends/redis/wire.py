"""Tensor-free wire format for ``SampleRef`` and ``DeadLetter``: strict JSON, never pickle.

A ref that crosses a process boundary (a Redis queue, a log line) is encoded
as one JSON object with an explicit schema (``WIRE_VERSION``). Decoding is
strict: unknown or missing fields, wrong types, duplicate keys, NaN/Infinity
and dtypes outside ``DTYPES`` raise ``ValueError`` naming the offending
value, so a peer can never smuggle an object (or a tensor) into the reader.
Every decoded ref is rebuilt through the ``SampleRef`` constructor from
type-checked primitives, so it passes ``assert_no_tensors`` by construction.

The Redis queue's server functions write records with named fields (``cjson``), which this module is the
Python codec of: dead letters (``DEAD_LETTER_FIELDS``, the same format ``dead_letter_to_json`` writes) and the
state a traced event left (``EVENT_STATE_FIELDS``), both JSON, and lease records (``LEASE_FIELDS``, tab-separated
in that order: every acquire writes one and every ack reads one, so the Lua's codec is generated from that list).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

from featurestream.common.refs import FeatureAlgorithm, FeatureSpec, SampleRef, algorithm_name, resolve_algorithm
from featurestream.core.lease import DeadLetter

__all__ = [
    "DEAD_LETTER_FIELDS",
    "DTYPES",
    "EVENT_STATE_FIELDS",
    "LEASE_FIELDS",
    "WIRE_VERSION",
    "dead_letter_from_json",
    "dead_letter_to_json",
    "event_state",
    "lease_fields",
    "lease_issued",
    "ref_from_json",
    "ref_to_json",
]

WIRE_VERSION = 1

# Plain numeric dtypes only: quantized and bit-packed dtypes have no stable byte layout across versions.
_DTYPE_NAMES = (
    "float64",
    "float32",
    "float16",
    "bfloat16",
    "complex128",
    "complex64",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint64",
    "uint32",
    "uint16",
    "uint8",
    "bool",
    "float8_e4m3fn",
    "float8_e5m2",
)
DTYPES: Mapping[str, torch.dtype] = MappingProxyType(
    {name: getattr(torch, name) for name in _DTYPE_NAMES if isinstance(getattr(torch, name, None), torch.dtype)}
)
_DTYPE_NAME = {dtype: name for name, dtype in DTYPES.items()}

_REF_FIELDS = {
    "v": int,
    "sample_id": str,
    "run_id": str,
    "store_uri": str,
    "algorithm": str,
    "schema_version": int,
    "num_tokens": int,
    "estimated_bytes": int,
    "target_model_version": str,
    "draft_weight_version": str,
    "features": list,
}
_FEATURE_FIELDS = {"name": str, "key": str, "shape": list, "dtype": str}
# Written only when the ref has one (a ref of the reference's encodings has none, and its text is unchanged).
_PROVENANCE = "provenance"
# A dead letter: its sample id, its ref's JSON as text (the very text that was queued, so a requeue or a reader
# gets it back byte for byte, whoever wrote the letter), why it died and after how many deliveries.
_DEAD_FIELDS = {"sample": str, "ref": str, "reason": str, "deliveries": int}
DEAD_LETTER_FIELDS = tuple(_DEAD_FIELDS)
# A live lease's record in Redis, its fields tab-separated in this order (the Lua codec is generated from this
# list): when the server leased it (its TIME, seconds), its token, the redelivery count, the put token of the put
# it delivers and the sample id (last: it may hold tabs).
LEASE_FIELDS = ("issued", "token", "n", "put", "sample")
# The state a traced event left: the redelivery count ``n`` and the lease's ``deadline`` ('' where none), the
# ``pending`` and ``outstanding`` counts, and the call's clock ``now``.
EVENT_STATE_FIELDS = ("n", "pending", "outstanding", "now", "deadline")
# JSON string literal of a str, as JSONEncoder(ensure_ascii=False) writes it (the C implementation).
_STRING = json.encoder.encode_basestring
# The encoded tail of a feature object by spec (',"shape":[...],"dtype":"..."}'): a run repeats a few specs.
_SPEC_JSON: dict[FeatureSpec, str] = {}
# Decoded specs by (dtype name, *shape): FeatureSpec is immutable, and a run repeats a few shapes many times.
_SPEC_CACHE: dict[tuple[object, ...], FeatureSpec] = {}
_SPEC_CACHE_LIMIT = 4096


def ref_to_json(ref: SampleRef) -> str:
    """Encode ``ref`` canonically: the schema's field order, features in ``feature_names()`` order, no spaces.

    ``ValueError`` for a dtype not in ``DTYPES``. Built from cached pieces rather than through a dict and
    ``json``: a producer encodes every ref it puts.
    """
    if not isinstance(ref, SampleRef):
        raise TypeError(f"ref_to_json expects a SampleRef, got {type(ref).__name__}")
    features = ",".join(
        f'{{"name":{_STRING(name)},"key":{_STRING(ref.feature_keys[name])}{_spec_json(ref, name)}'
        for name in ref.feature_names()
    )
    # SampleRef's constructor guarantees the ints are non-negative ints (never bools) and the rest strs.
    return (
        f'{{"v":{WIRE_VERSION},"sample_id":{_STRING(ref.sample_id)},"run_id":{_STRING(ref.run_id)},'
        f'"store_uri":{_STRING(ref.store_uri)},"algorithm":{_STRING(algorithm_name(ref.algorithm))},'
        f'"schema_version":{ref.schema_version:d},"num_tokens":{ref.num_tokens:d},'
        f'"estimated_bytes":{ref.estimated_bytes:d},"target_model_version":{_STRING(ref.target_model_version)},'
        f'"draft_weight_version":{_STRING(ref.draft_weight_version)},{_provenance_json(ref)}"features":[{features}]}}'
    )


def _provenance_json(ref: SampleRef) -> str:
    """``"provenance":{...},`` for a ref with provenance entries, else nothing."""
    if not ref.provenance:
        return ""
    return f'"{_PROVENANCE}":{json.dumps(dict(ref.provenance), separators=(",", ":"), ensure_ascii=False)},'


def ref_from_json(text: str | bytes) -> SampleRef:
    """Decode a ref encoded by ``ref_to_json``; ``ValueError`` for anything outside the schema."""
    if isinstance(text, (str, bytes)):
        # Fast path: a text that is exactly the canonical encoding of the ref it parses to holds no duplicate
        # key, NaN, stray field or value of another type (``ref_to_json`` writes none), so the ref is built
        # without checking each field first; anything else, or anything the build refuses, is parsed strictly.
        try:
            ref = _ref_from_canonical(json.loads(text))
        except (ValueError, TypeError, KeyError, AttributeError):
            ref = None
        if ref is not None:
            canonical = ref_to_json(ref)
            if canonical == (text if isinstance(text, str) else text.decode("utf-8", "replace")):
                return ref
    return _ref_from_obj(_loads(text, "ref"), "ref")


def dead_letter_to_json(dead: DeadLetter) -> str:
    """Encode a dead letter as ``{"sample": id, "ref": <ref JSON text>, "reason": str, "deliveries": int}``."""
    return json.dumps(
        {
            "sample": dead.ref.sample_id,
            "ref": ref_to_json(dead.ref),
            "reason": dead.reason,
            "deliveries": dead.deliveries,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )


def dead_letter_from_json(text: str | bytes) -> DeadLetter:
    """Decode a dead letter encoded by ``dead_letter_to_json`` or by the Redis queue's server functions (the
    same fields, in any order); ``ValueError`` for anything outside the schema or a ``sample`` that is not the
    ref's id."""
    obj = _loads(text, "dead letter")
    _check_fields(obj, _DEAD_FIELDS, "dead letter")
    if obj["deliveries"] < 1:
        raise ValueError(f"dead letter deliveries must be >= 1, got {obj['deliveries']!r}")
    try:
        ref = ref_from_json(obj["ref"])
    except ValueError as exc:
        raise ValueError(f"dead letter ref: {exc}") from None
    if ref.sample_id != obj["sample"]:
        raise ValueError(f"dead letter names sample {obj['sample']!r} but holds the ref of {ref.sample_id!r}")
    return DeadLetter(ref, obj["reason"], obj["deliveries"])


def lease_fields(record: str | bytes) -> dict[str, str]:
    """A Redis lease record's fields by name (``LEASE_FIELDS``); ``ValueError`` for a record with fewer."""
    text = record.decode() if isinstance(record, bytes) else record
    values = text.split("\t", len(LEASE_FIELDS) - 1)
    if len(values) != len(LEASE_FIELDS):
        raise ValueError(
            f"lease record {text!r:.80} has {len(values)} fields, not the {len(LEASE_FIELDS)} {LEASE_FIELDS}"
        )
    return dict(zip(LEASE_FIELDS, values, strict=True))


def lease_issued(record: str | bytes) -> float:
    """When the server leased the lease of a Redis lease record (``LEASE_FIELDS``), in its TIME's seconds."""
    return float(lease_fields(record)["issued"])


def event_state(text: str | bytes) -> dict[str, object]:
    """The state a traced Redis event left (``EVENT_STATE_FIELDS``), as the in-process queue traces it:
    ``pending``, ``outstanding``, the call's clock ``now``, and ``n`` and ``deadline`` when the event has them."""
    obj = json.loads(text)
    values: dict[str, object] = {
        "pending": int(obj["pending"]), "outstanding": int(obj["outstanding"]), "now": float(obj["now"]),
    }  # fmt: skip
    if obj["n"] != "":
        values["n"] = int(obj["n"])
    if obj["deadline"] != "":
        values["deadline"] = float(obj["deadline"])
    return values


# -- internals -----------------------------------------------------------------
def _spec_json(ref: SampleRef, name: str) -> str:
    spec = ref.feature_specs[name]
    tail = _SPEC_JSON.get(spec)
    if tail is None:
        dtype_name = _DTYPE_NAME.get(spec.dtype)
        if dtype_name is None:
            raise ValueError(
                f"sample {ref.sample_id!r} feature {name!r} has dtype {spec.dtype}, which the wire format does not "
                f"carry; known dtypes: {sorted(DTYPES)}"
            )
        tail = f',"shape":[{",".join(f"{dim:d}" for dim in spec.shape)}],"dtype":"{dtype_name}"}}'
        if len(_SPEC_JSON) >= _SPEC_CACHE_LIMIT:
            _SPEC_JSON.clear()
        _SPEC_JSON[spec] = tail
    return tail


def _reject_constant(name: str) -> None:
    raise ValueError(f"wire JSON may not contain {name}")


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"wire JSON has duplicate key {key!r}")
            seen.add(key)
    return obj


def _loads(text: str | bytes, what: str) -> dict[str, Any]:
    if not isinstance(text, (str, bytes)):
        raise TypeError(f"{what} wire text must be str or bytes, got {type(text).__name__}")
    try:
        obj = json.loads(text, object_pairs_hook=_unique_pairs, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} wire text is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{what} wire text must hold a JSON object, got {type(obj).__name__}")
    return obj


def _check_fields(obj: dict[str, Any], fields: dict[str, type], what: str) -> None:
    # Fast path: exactly the schema's fields, each of exactly its type (JSON yields no subclasses; bool is not int).
    if obj.keys() == fields.keys() and all(type(obj[name]) is kind for name, kind in fields.items()):
        return
    unknown = sorted(set(obj) - set(fields))
    if unknown:
        raise ValueError(f"{what} has unknown fields {unknown}")
    missing = sorted(set(fields) - set(obj))
    if missing:
        raise ValueError(f"{what} is missing fields {missing}")
    for name, kind in fields.items():
        value = obj[name]
        # bool is an int subclass in Python; the schema never means a bool by int.
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ValueError(f"{what} field {name!r} must be {kind.__name__}, got {value!r:.80}")


def _spec(dtype_name: str, shape: list[Any], where: str) -> FeatureSpec:
    cache_key = (dtype_name, *shape)
    spec = _SPEC_CACHE.get(cache_key)
    if spec is not None and all(type(dim) is int for dim in shape):  # 1 and True are equal keys
        return spec
    dtype = DTYPES.get(dtype_name)
    if dtype is None:
        raise ValueError(f"{where} has unknown dtype {dtype_name!r}; known dtypes: {sorted(DTYPES)}")
    if not all(type(dim) is int for dim in shape):
        raise ValueError(f"{where} shape must be a list of ints, got {shape!r}")
    spec = FeatureSpec(tuple(shape), dtype)
    if len(_SPEC_CACHE) >= _SPEC_CACHE_LIMIT:
        _SPEC_CACHE.clear()
    _SPEC_CACHE[cache_key] = spec
    return spec


def _ref_from_canonical(obj: Any) -> SampleRef:
    """The ref ``obj`` describes, with no check of its own: the caller keeps it only if it re-encodes to the very
    text ``obj`` was decoded from. ``SampleRef`` and ``FeatureSpec`` still refuse what they always refuse."""
    features = obj["features"]
    specs = {}
    for feature in features:
        shape = feature["shape"]
        spec = _SPEC_CACHE.get((feature["dtype"], *shape))
        # a cached spec under an equal key of other types (1.0, True) re-encodes to other text: no match
        specs[feature["name"]] = spec if spec is not None else _spec(feature["dtype"], shape, "ref")
    keys = {feature["name"]: feature["key"] for feature in features}
    return _build_ref(obj, keys, specs, resolve_algorithm(obj["algorithm"]))


def _build_ref(
    obj: dict[str, Any], keys: dict[str, str], specs: dict[str, FeatureSpec], algorithm: FeatureAlgorithm | str
) -> SampleRef:
    """``SampleRef`` from a decoded object's scalar fields and its features (the constructor validates it)."""
    return SampleRef(
        sample_id=obj["sample_id"],
        run_id=obj["run_id"],
        store_uri=obj["store_uri"],
        feature_keys=keys,
        feature_specs=specs,
        algorithm=algorithm,
        schema_version=obj["schema_version"],
        num_tokens=obj["num_tokens"],
        estimated_bytes=obj["estimated_bytes"],
        target_model_version=obj["target_model_version"],
        draft_weight_version=obj["draft_weight_version"],
        provenance=obj.get(_PROVENANCE),
    )


def _ref_from_obj(obj: object, what: str) -> SampleRef:
    if not isinstance(obj, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(obj).__name__}")
    provenance = obj.get(_PROVENANCE)
    if provenance is not None and not isinstance(provenance, dict):
        raise ValueError(f"{what} field {_PROVENANCE!r} must be an object, got {provenance!r:.80}")
    _check_fields({name: value for name, value in obj.items() if name != _PROVENANCE}, _REF_FIELDS, what)
    if obj["v"] != WIRE_VERSION:
        raise ValueError(f"{what} has wire version {obj['v']!r}; this reader speaks version {WIRE_VERSION}")
    keys: dict[str, str] = {}
    specs: dict[str, FeatureSpec] = {}
    for index, feature in enumerate(obj["features"]):
        where = f"{what}.features[{index}]"
        if not isinstance(feature, dict):
            raise ValueError(f"{where} must be a JSON object, got {type(feature).__name__}")
        _check_fields(feature, _FEATURE_FIELDS, where)
        name = feature["name"]
        if name in specs:
            raise ValueError(f"{where} repeats feature {name!r}")
        keys[name] = feature["key"]
        specs[name] = _spec(feature["dtype"], feature["shape"], where)
    try:
        # A built-in algorithm, or a well-formed name of a user's: a consumer that has not registered it fails
        # its lease back with a message saying how to (featurestream.pipeline.register_algorithm).
        algorithm = resolve_algorithm(obj["algorithm"])
    except ValueError as exc:
        raise ValueError(f"{what} has a malformed algorithm: {exc}") from None
    # Every value is a checked primitive, and SampleRef's constructor validates the rest (no tensor can get in).
    return _build_ref(obj, keys, specs, algorithm)
