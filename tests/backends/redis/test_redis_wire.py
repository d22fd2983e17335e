"""The strict tensor-free wire format for refs and dead letters."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch

from featurestream import DeadLetter, LocalFeatureStore, SampleRef, assert_no_tensors
from featurestream.backends.redis.wire import (
    DEAD_LETTER_FIELDS,
    DTYPES,
    EVENT_STATE_FIELDS,
    LEASE_FIELDS,
    dead_letter_from_json,
    dead_letter_to_json,
    event_state,
    lease_fields,
    lease_issued,
    ref_from_json,
    ref_to_json,
)
from featurestream.testing import sample_tensors

Factory = Callable[..., Any]


@pytest.fixture
def ref() -> SampleRef:
    store = LocalFeatureStore()
    tensors = sample_tensors(2)
    tensors["aux_hidden_states"] = tensors["aux_hidden_states"].to(torch.bfloat16)
    return store.put("sample\t/ünï", tensors, run_id="run-7", num_tokens=3, target_model_version="t1")


def test_round_trip_keeps_every_field_and_feature_order(ref: SampleRef) -> None:
    back = ref_from_json(ref_to_json(ref))
    assert back == ref
    assert back.feature_names() == ref.feature_names()
    assert back.feature_specs["aux_hidden_states"].dtype is torch.bfloat16
    assert_no_tensors(back)
    assert ref_from_json(ref_to_json(ref).encode()) == ref


def test_encoding_is_canonical_json(ref: SampleRef) -> None:
    """The fast encoder writes exactly what json writes for the schema's objects (field order, no spaces)."""
    text = ref_to_json(ref)
    assert json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False) == text
    dead = dead_letter_to_json(DeadLetter(ref, "expired 2 times", 2))
    assert json.dumps(json.loads(dead), separators=(",", ":"), ensure_ascii=False) == dead


def test_non_canonical_text_is_decoded_strictly(ref: SampleRef) -> None:
    """Text from another writer (spaces, other key order) decodes through the strict path, to the same ref."""
    obj = json.loads(ref_to_json(ref))
    assert ref_from_json(json.dumps(dict(reversed(obj.items())), indent=2)) == ref
    duplicated = ref_to_json(ref).replace('"run_id":"run-7"', '"run_id":"x","run_id":"run-7"')
    with pytest.raises(ValueError, match="duplicate key 'run_id'"):
        ref_from_json(duplicated)


def test_dead_letter_round_trip(ref: SampleRef) -> None:
    dead = DeadLetter(ref, "failed 3 times (max_deliveries=3)", 3)
    assert dead_letter_from_json(dead_letter_to_json(dead)) == dead


def _mutated(ref: SampleRef, change: object, compact: bool = False) -> str:
    """The ref's JSON changed by ``change``: spaced (the strict path), or written as ``ref_to_json`` writes
    (no spaces, schema order: the fast path, which must refuse the change too)."""
    obj = json.loads(ref_to_json(ref))
    change(obj)  # type: ignore[operator]
    if compact:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return json.dumps(obj)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda o: o.update(extra=1), r"unknown fields \['extra'\]"),
        (lambda o: o.pop("run_id"), r"missing fields \['run_id'\]"),
        (lambda o: o.update(num_tokens=True), "'num_tokens' must be int"),
        (lambda o: o.update(num_tokens="3"), "'num_tokens' must be int"),
        (lambda o: o.update(v=2), "wire version 2"),
        (lambda o: o.update(algorithm="Medusa!"), "malformed algorithm: 'Medusa!'"),
        (lambda o: o.update(algorithm="x" * 65), "malformed algorithm"),
        (lambda o: o["features"][0].update(dtype="object"), "unknown dtype 'object'"),
        (lambda o: o["features"][0].update(dtype="torch.float32"), "unknown dtype 'torch.float32'"),
        (lambda o: o["features"][0].update(shape=[1, 2.5]), "shape must be a list of ints"),
        (lambda o: o["features"][0].update(pickle="gASV"), "unknown fields"),
        (lambda o: o["features"].append(dict(o["features"][0])), "repeats feature"),
        (lambda o: o["features"].pop(0), r"missing required features \[.aux_hidden_states.\]"),
        (lambda o: o.update(store_uri="nowhere"), "store_uri"),
        (lambda o: o["features"][0].update(shape=[True] * len(o["features"][0]["shape"])), "list of ints"),
        (lambda o: o["features"][0].update(shape=[1.0] * len(o["features"][0]["shape"])), "list of ints"),
        (lambda o: o["features"][0].update(key=7), "'key' must be str"),
        (lambda o: o["features"][0].update(name=None), "'name' must be str"),
        (lambda o: o.update(features={}), "'features' must be list"),
    ],
)
@pytest.mark.parametrize("compact", [False, True], ids=["spaced", "compact"])
def test_decoding_is_strict(ref: SampleRef, change: object, match: str, compact: bool) -> None:
    with pytest.raises(ValueError, match=match):
        ref_from_json(_mutated(ref, change, compact))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[]", "must hold a JSON object"),
        ("{", "not valid JSON"),
        ('{"v": NaN}', "may not contain NaN"),
        ('{"v": 1, "v": 1}', "duplicate key 'v'"),
    ],
)
def test_malformed_text_is_rejected(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ref_from_json(text)


def test_non_text_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must be str or bytes"):
        ref_from_json(12)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expects a SampleRef"):
        ref_to_json({"sample_id": "x"})  # type: ignore[arg-type]


def test_dtypes_without_a_wire_name_are_refused_on_encode() -> None:
    store = LocalFeatureStore()
    ref = store.put("q", sample_tensors(0))
    spec = ref.feature_specs["loss_mask"]
    odd = SampleRef(
        **{
            **{f: getattr(ref, f) for f in ("sample_id", "run_id", "store_uri", "algorithm", "schema_version")},
            "feature_keys": dict(ref.feature_keys),
            "feature_specs": {**ref.feature_specs, "loss_mask": type(spec)(spec.shape, torch.qint8)},
            "num_tokens": 0,
            "estimated_bytes": 1,
            "target_model_version": "0",
            "draft_weight_version": "0",
        }
    )
    with pytest.raises(ValueError, match=r"dtype torch\.qint8, which the wire format does not carry"):
        ref_to_json(odd)
    assert "qint8" not in DTYPES


def test_dead_letter_decoding_is_strict(ref: SampleRef) -> None:
    good = json.loads(dead_letter_to_json(DeadLetter(ref, "expired 2 times", 2)))
    with pytest.raises(ValueError, match="deliveries must be >= 1"):
        dead_letter_from_json(json.dumps({**good, "deliveries": 0}))
    with pytest.raises(ValueError, match="unknown fields"):
        dead_letter_from_json(json.dumps({**good, "callback": "os.system"}))
    with pytest.raises(ValueError, match="dead letter ref"):
        dead_letter_from_json(json.dumps({**good, "ref": good["ref"].replace('"v":1', '"v":9')}))
    with pytest.raises(ValueError, match="names sample 's9' but holds the ref of"):
        dead_letter_from_json(json.dumps({**good, "sample": "s9"}))


# -- the Redis functions' records against this codec, through a real redis-server -------------------------------
def test_the_servers_lease_records_are_the_codecs(make: Factory) -> None:
    store = LocalFeatureStore()
    queue = make(store)
    queue.put(store.put("s0\tx", sample_tensors(0)))  # the id is the last field: it may hold tabs
    lease = queue.acquire(timeout=0)
    raw = queue._redis.hget(queue._key["leases"], f"{lease.lease_id:016d}")
    record = lease_fields(raw)
    assert list(record) == list(LEASE_FIELDS)
    assert (record["token"], record["n"], record["sample"]) == (lease.token, "0", "s0\tx")
    assert record["put"].startswith(queue._engine._token_prefix)
    assert lease_issued(raw) == float(record["issued"]) > 0


def test_the_servers_dead_letters_are_the_codecs(make: Factory) -> None:
    store = LocalFeatureStore()
    queue = make(store, max_deliveries=1)
    ref = store.put("sample\t/ünï", sample_tensors(0))
    queue.put(ref)
    queue.fail(queue.acquire(timeout=0))
    (raw,) = queue._redis.lrange(queue._key["dead"], 0, -1)
    record = json.loads(raw)
    assert sorted(record) == sorted(DEAD_LETTER_FIELDS)
    assert record["ref"] == ref_to_json(ref)  # the very text that was queued
    assert dead_letter_from_json(raw) == DeadLetter(ref, "failed 1 times (max_deliveries=1)", 1)
    letter = dead_letter_from_json(dead_letter_to_json(DeadLetter(ref, "failed 1 times (max_deliveries=1)", 1)))
    assert letter == queue.dead_letters()[0]


def test_the_servers_traced_states_are_the_codecs(make: Factory) -> None:
    queue = make(LocalFeatureStore(), tracer=lambda action, fields: None, clock=lambda: 1000.0)
    raw = queue._engine._run("reclaim")[-1]  # the state a traced reclaim left
    assert sorted(json.loads(raw)) == sorted(EVENT_STATE_FIELDS)
    assert event_state(raw) == {"pending": 0, "outstanding": 0, "now": 1000.0}


def test_a_record_without_the_codecs_fields_is_refused() -> None:
    with pytest.raises(ValueError, match=r"lease record '1\\tt\\t0\\tp' has 4 fields, not the 5"):
        lease_issued("1\tt\t0\tp")
