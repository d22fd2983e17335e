from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch

from featurestream import FeatureAlgorithm, FeatureSpec, SampleRef, assert_no_tensors

from .ref_fields import ref_fields

SPECS = {
    "aux_hidden_states": FeatureSpec((1, 4, 24), torch.float32),
    "input_ids": FeatureSpec((1, 4), torch.long),
    "attention_mask": FeatureSpec((1, 4), torch.long),
    "loss_mask": FeatureSpec((1, 4), torch.long),
}


def make_ref(**overrides: object) -> SampleRef:
    return SampleRef(**ref_fields(SPECS, **overrides))  # type: ignore[arg-type]


def test_algorithm_values_and_field_order() -> None:
    assert [a.value for a in FeatureAlgorithm] == ["eagle3", "dflash", "dspark"]
    assert [f.name for f in dataclasses.fields(SampleRef)] == [
        "sample_id", "run_id", "store_uri", "feature_keys", "feature_specs", "algorithm",
        "schema_version", "num_tokens", "estimated_bytes", "target_model_version", "draft_weight_version",
    ]  # fmt: skip


def test_feature_spec_normalises_list_shape() -> None:
    assert FeatureSpec([2, 3], torch.float16) == FeatureSpec((2, 3), torch.float16)
    assert FeatureSpec([2, 3], torch.float16).shape == (2, 3)


@pytest.mark.parametrize("shape", [(2, -1), (2.0,), ("a",), (True,), "ab", 3])
def test_feature_spec_rejects_bad_dimension(shape: tuple[object, ...]) -> None:
    with pytest.raises(ValueError, match="tuple of non-negative ints"):
        FeatureSpec(shape, torch.float32)  # type: ignore[arg-type]


def test_ref_mappings_are_read_only_and_ordered() -> None:
    ref = make_ref()
    with pytest.raises(TypeError):
        ref.feature_keys["x"] = "y"  # type: ignore[index]
    with pytest.raises(TypeError):
        ref.feature_specs["x"] = SPECS["input_ids"]  # type: ignore[index]
    assert ref.feature_names() == tuple(SPECS)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"sample_id": ""}, "sample_id"),
        ({"run_id": 3}, "run_id"),
        ({"store_uri": "nowhere"}, "store_uri"),
        ({"feature_keys": {"input_ids": "k"}}, "must name the same feature set"),
        ({"feature_keys": {1: "k"}}, "control-plane dicts must be str-keyed"),
        ({"num_tokens": -1}, "num_tokens"),
        ({"estimated_bytes": -5}, "estimated_bytes"),
        ({"schema_version": "1"}, "schema_version"),
    ],
)
def test_ref_construction_errors(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_ref(**overrides)


def test_ref_requires_the_algorithms_features() -> None:
    specs = {k: v for k, v in SPECS.items() if k != "loss_mask"}
    keys = {k: k for k in specs}
    with pytest.raises(ValueError, match=r"missing required features \['loss_mask'\]"):
        make_ref(feature_specs=specs, feature_keys=keys)
    with pytest.raises(ValueError, match="target_hidden_states"):
        make_ref(algorithm=FeatureAlgorithm.DSPARK)


def test_ref_rejects_a_tensor_inside() -> None:
    with pytest.raises(ValueError, match=r"ref\.target_model_version .*tensor-like object is not allowed"):
        make_ref(target_model_version=torch.zeros(1))


def test_ref_pickles_and_hashes() -> None:
    ref = make_ref()
    clone = pickle.loads(pickle.dumps(ref))
    assert clone == ref and hash(clone) == hash(ref)
    assert {ref, clone} == {ref}


class _TensorLike:
    def data_ptr(self) -> int:
        return 0

    is_cuda = False

    def numel(self) -> int:
        return 1


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        ({"meta": {"x": [1, torch.zeros(2)]}}, "ref['meta']['x'][1]"),
        ((1, np.zeros(3)), "ref[1]"),
        ([_TensorLike()], "ref[0]"),
    ],
)
def test_assert_no_tensors_names_the_path(obj: object, path: str) -> None:
    with pytest.raises(ValueError, match="tensor-like object is not allowed") as excinfo:
        assert_no_tensors(obj)
    assert path in str(excinfo.value)


def test_assert_no_tensors_rejects_non_str_keys_and_passes_primitives() -> None:
    with pytest.raises(ValueError, match="non-str key 1: control-plane dicts must be str-keyed"):
        assert_no_tensors({1: "a"})
    assert_no_tensors({"a": [1, 2.0, "s", b"b", None, True, (3,)]})
    assert_no_tensors(make_ref())
