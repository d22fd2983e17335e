"""compat.md, refs: the control plane's names, return types and error phrases, as a recipe imports them."""

from __future__ import annotations

import pytest
import torch

from featurestream.refs import FeatureSpec, SampleRef, assert_no_tensors
from support.ref_fields import ref_fields

SPECS = {
    "aux_hidden_states": FeatureSpec((1, 4, 12), torch.float32),
    "input_ids": FeatureSpec((1, 4), torch.long),
    "attention_mask": FeatureSpec((1, 4), torch.long),
    "loss_mask": FeatureSpec((1, 4), torch.long),
    "logits": FeatureSpec((1, 4, 8), torch.float32),
}


def ref(**overrides: object) -> SampleRef:
    """A valid ref, built by the reference's ``SampleRef``."""
    return SampleRef(**ref_fields(SPECS, **overrides))  # type: ignore[arg-type]


def test_feature_names_is_a_tuple_in_feature_keys_insertion_order() -> None:
    keys = {name: f"s/{name}" for name in reversed(SPECS)}
    names = ref(feature_keys=keys).feature_names()
    assert isinstance(names, tuple) and names == tuple(reversed(SPECS))


@pytest.mark.parametrize("shape", [(2, -1), (2, 1.5), (2.0,), ("3",), "ab"])
def test_feature_spec_with_a_bad_shape(shape: object) -> None:
    with pytest.raises(ValueError, match="tuple of non-negative ints"):
        FeatureSpec(shape, torch.float32)  # type: ignore[arg-type]


def test_sample_ref_whose_keys_and_specs_differ() -> None:
    keys = {name: name for name in SPECS if name != "logits"}
    with pytest.raises(ValueError, match="must name the same feature set"):
        ref(feature_keys=keys)


@pytest.mark.parametrize("obj", [torch.zeros(1), {"a": [1, {"b": torch.zeros(2)}]}, (0, torch.ones(1))])
def test_assert_no_tensors_on_a_tensor_at_any_depth(obj: object) -> None:
    with pytest.raises(ValueError, match="tensor-like object is not allowed"):
        assert_no_tensors(obj)


def test_a_tensor_at_sample_ref_construction() -> None:
    with pytest.raises(ValueError, match="tensor-like object is not allowed"):
        ref(run_id=torch.zeros(1))


def test_assert_no_tensors_on_a_non_str_dict_key() -> None:
    with pytest.raises(ValueError, match="control-plane dicts must be str-keyed"):
        assert_no_tensors({"meta": {3: "x"}})
