from __future__ import annotations

import copy
import dataclasses
import pickle

import numpy as np
import pytest
import torch

from featurestream import FeatureAlgorithm, FeatureSpec, SampleRef, assert_no_tensors
from featurestream.common.refs import check_tensor_free
from support.ref_fields import ref_fields

SPECS = {
    "aux_hidden_states": FeatureSpec((1, 4, 24), torch.float32),
    "input_ids": FeatureSpec((1, 4), torch.long),
    "attention_mask": FeatureSpec((1, 4), torch.long),
    "loss_mask": FeatureSpec((1, 4), torch.long),
    "logits": FeatureSpec((1, 4, 8), torch.float32),
}


def make_ref(**overrides: object) -> SampleRef:
    return SampleRef(**ref_fields(SPECS, **overrides))  # type: ignore[arg-type]


def test_algorithm_values_and_field_order() -> None:
    assert [a.value for a in FeatureAlgorithm] == ["eagle3", "dflash", "dspark", "eagle"]
    assert [f.name for f in dataclasses.fields(SampleRef)] == [
        "sample_id", "run_id", "store_uri", "feature_keys", "feature_specs", "algorithm",
        "schema_version", "num_tokens", "estimated_bytes", "target_model_version", "draft_weight_version",
        "provenance",
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


def test_asdict_and_deepcopy_of_a_ref_work_and_keep_its_values() -> None:
    ref = make_ref()
    as_dict = dataclasses.asdict(ref)
    assert as_dict["sample_id"] == ref.sample_id and as_dict["feature_keys"] == dict(ref.feature_keys)
    assert as_dict["feature_specs"]["input_ids"] == {"shape": (1, 4), "dtype": torch.long}
    assert copy.deepcopy(ref) == ref and dataclasses.replace(ref) == ref
    with pytest.raises(TypeError, match="read-only"):
        ref.feature_keys.update(x="y")  # type: ignore[attr-defined]


@dataclasses.dataclass(frozen=True, eq=False)
class _RefWithExtra(SampleRef):
    extra: object = None


class _RefWithAttribute(SampleRef):
    pass


@dataclasses.dataclass(frozen=True)
class _SpecWithExtra(FeatureSpec):
    note: object = None


def test_check_tensor_free_finds_a_tensor_anywhere_in_a_ref() -> None:
    check_tensor_free(make_ref())
    fields = ref_fields(SPECS)
    with pytest.raises(TypeError, match=r"sample 's0' cannot travel as a ref: ref.extra\['x'\]\[0\] holds a Tensor"):
        check_tensor_free(_RefWithExtra(**fields, extra={"x": [torch.zeros(1)]}))  # type: ignore[arg-type]
    hidden = _RefWithAttribute(**fields)  # type: ignore[arg-type]
    object.__setattr__(hidden, "cache", np.zeros(2))
    with pytest.raises(TypeError, match=r"ref.cache holds a ndarray"):
        check_tensor_free(hidden)
    specs = {**SPECS, "loss_mask": _SpecWithExtra((1, 4), torch.long, note=torch.ones(1))}
    with pytest.raises(TypeError, match=r"ref.feature_specs\['loss_mask'\].note holds a Tensor"):
        check_tensor_free(make_ref(feature_specs=specs))
    check_tensor_free(_RefWithExtra(**fields, extra={"x": [1, "a"]}))  # type: ignore[arg-type]
