"""compat.md, eagle3: the reference's ten public names, their values and behaviours."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest
import torch

import featurestream.eagle3 as eagle3
from featurestream.eagle3 import (
    EAGLE3_CORE_FEATURES,
    EAGLE3_DRAFT_VOCAB_SUPERVISION,
    EAGLE3_LOGITS_SUPERVISION,
    EAGLE3_PACKING_FEATURES,
    EAGLE3_SCHEMA_VERSION,
    EAGLE3_SUPERVISION_ENCODINGS,
    eagle3_logits_feature_specs,
    eagle3_logits_tensors,
    validate_eagle3_packing_inputs,
    validate_eagle3_ref,
)
from featurestream.refs import FeatureAlgorithm, FeatureSpec
from featurestream.stores.local import LocalFeatureStore

from .conftest import PREFIX, Reference
from .recipe import packing, sample_tensors

REFERENCE_NAMES = (
    "EAGLE3_SCHEMA_VERSION",
    "EAGLE3_CORE_FEATURES",
    "EAGLE3_LOGITS_SUPERVISION",
    "EAGLE3_DRAFT_VOCAB_SUPERVISION",
    "EAGLE3_SUPERVISION_ENCODINGS",
    "EAGLE3_PACKING_FEATURES",
    "eagle3_logits_tensors",
    "eagle3_logits_feature_specs",
    "validate_eagle3_packing_inputs",
    "validate_eagle3_ref",
)


def test_the_ten_names_are_public() -> None:
    assert set(REFERENCE_NAMES) <= set(eagle3.__all__)


def test_constant_values() -> None:
    assert EAGLE3_SCHEMA_VERSION == 1
    assert EAGLE3_CORE_FEATURES == ("aux_hidden_states", "input_ids", "attention_mask", "loss_mask")
    assert EAGLE3_LOGITS_SUPERVISION == ("logits",)
    assert EAGLE3_DRAFT_VOCAB_SUPERVISION == ("target_probs", "position_mask")
    assert EAGLE3_SUPERVISION_ENCODINGS == EAGLE3_CORE_FEATURES + EAGLE3_LOGITS_SUPERVISION
    assert EAGLE3_PACKING_FEATURES == ("position_ids", "seq_lens", "doc_remaining")


def test_featurestreams_own_names_are_the_same_objects() -> None:
    assert eagle3.CORE_FEATURES is EAGLE3_CORE_FEATURES and eagle3.SCHEMA_VERSION == EAGLE3_SCHEMA_VERSION
    assert eagle3.PACKING_FEATURES is EAGLE3_PACKING_FEATURES


def logits_kwargs(with_packing: bool) -> dict[str, torch.Tensor]:
    tensors = sample_tensors(0)
    return {**tensors, **packing()} if with_packing else tensors


@pytest.mark.parametrize("with_packing", [False, True])
def test_eagle3_logits_tensors_keys_in_order_optional_only_when_given(with_packing: bool) -> None:
    kwargs = logits_kwargs(with_packing)
    tensors = eagle3_logits_tensors(**dict(reversed(kwargs.items())))
    expected = EAGLE3_SUPERVISION_ENCODINGS + (EAGLE3_PACKING_FEATURES if with_packing else ())
    assert tuple(tensors) == expected
    assert all(tensors[name] is kwargs[name] for name in expected)
    assert all(p.kind is p.KEYWORD_ONLY for p in inspect.signature(eagle3_logits_tensors).parameters.values())


@pytest.mark.parametrize("with_packing", [False, True])
def test_eagle3_logits_feature_specs_exact_shapes_and_dtypes(with_packing: bool) -> None:
    kwargs = logits_kwargs(with_packing)
    positional = [kwargs.pop(name) for name in EAGLE3_SUPERVISION_ENCODINGS]
    specs = eagle3_logits_feature_specs(*positional, **kwargs)
    tensors = dict(zip(EAGLE3_SUPERVISION_ENCODINGS, positional, strict=True)) | kwargs
    assert specs == {name: FeatureSpec(tuple(t.shape), t.dtype) for name, t in tensors.items()}
    assert tuple(specs) == tuple(eagle3_logits_tensors(**tensors))


@pytest.mark.parametrize("given", [("position_ids",), ("seq_lens", "doc_remaining"), ("doc_remaining",)])
def test_validate_eagle3_packing_inputs_all_three_or_none(given: tuple[str, ...]) -> None:
    values = {name: (packing()[name] if name in given else None) for name in EAGLE3_PACKING_FEATURES}
    with pytest.raises(ValueError, match="position_ids, seq_lens, and doc_remaining together"):
        validate_eagle3_packing_inputs(**values)
    validate_eagle3_packing_inputs(position_ids=None, seq_lens=None, doc_remaining=None)
    validate_eagle3_packing_inputs(**packing())
    with pytest.raises(TypeError):
        validate_eagle3_packing_inputs(None, None, None)  # type: ignore[misc]


def put(tensors: dict[str, torch.Tensor], **kwargs: object) -> object:
    return LocalFeatureStore().put("s", tensors, **kwargs)  # type: ignore[arg-type]


def test_validate_eagle3_ref_accepts_both_encodings_with_and_without_packing() -> None:
    validate_eagle3_ref(put(sample_tensors(0)))  # type: ignore[arg-type]
    validate_eagle3_ref(put({**sample_tensors(0, encoding="draft-vocab"), **packing()}))  # type: ignore[arg-type]


def test_validate_eagle3_ref_wrong_algorithm() -> None:
    tensors = {"hidden_states": torch.zeros(1), **sample_tensors(0)}
    with pytest.raises(ValueError, match=r"must be FeatureAlgorithm\.EAGLE3.*for an EAGLE-3 consumer"):
        validate_eagle3_ref(put(tensors, algorithm=FeatureAlgorithm.DFLASH))  # type: ignore[arg-type]


def test_validate_eagle3_ref_missing_core_feature() -> None:
    # SampleRef itself refuses an EAGLE-3 ref without its core features, with the reference's SampleRef phrase ...
    with pytest.raises(ValueError, match="missing required features"):
        put({k: v for k, v in sample_tensors(0).items() if k != "loss_mask"})
    # ... and so does validate_eagle3_ref, for a ref that skipped those checks (unpickled from elsewhere, forged).
    ref = put(sample_tensors(0))
    forged = object.__new__(type(ref))
    for field in dataclasses.fields(ref):  # type: ignore[arg-type]
        value = getattr(ref, field.name)
        if field.name in ("feature_keys", "feature_specs"):
            value = {name: item for name, item in value.items() if name != "loss_mask"}
        object.__setattr__(forged, field.name, value)
    with pytest.raises(ValueError, match="missing required core features"):
        validate_eagle3_ref(forged)


def test_validate_eagle3_ref_partial_packing() -> None:
    tensors = {**sample_tensors(0), "position_ids": torch.zeros(1, 6, dtype=torch.long)}
    with pytest.raises(ValueError, match="position_ids, seq_lens, and doc_remaining together"):
        validate_eagle3_ref(put(tensors))  # type: ignore[arg-type]


@pytest.mark.parametrize("kept", ["target_probs", "position_mask"])
def test_validate_eagle3_ref_partial_draft_vocab_encoding(kept: str) -> None:
    # Beside logits: half a pair alone is no supervision at all (validate_eagle3_ref says which, below).
    tensors = {**sample_tensors(0), **sample_tensors(0, encoding="draft-vocab")}
    del tensors[({"target_probs", "position_mask"} - {kept}).pop()]
    with pytest.raises(ValueError, match="partial draft-vocab encoding"):
        validate_eagle3_ref(put(tensors))  # type: ignore[arg-type]


def test_validate_eagle3_ref_both_encodings() -> None:
    tensors = {**sample_tensors(0), **sample_tensors(0, encoding="draft-vocab")}
    with pytest.raises(ValueError, match="both 'logits' and draft-vocab features"):
        validate_eagle3_ref(put(tensors))  # type: ignore[arg-type]


def test_validate_eagle3_ref_no_encoding() -> None:
    # As the reference's: the store takes the sample and its ref, and the validator refuses it.
    tensors = {k: v for k, v in sample_tensors(0).items() if k != "logits"}
    with pytest.raises(ValueError, match="no supervision encoding"):
        validate_eagle3_ref(put(tensors))  # type: ignore[arg-type]
    half = {**tensors, "target_probs": sample_tensors(0, encoding="draft-vocab")["target_probs"]}
    with pytest.raises(ValueError, match="partial draft-vocab encoding"):
        validate_eagle3_ref(put(half))  # type: ignore[arg-type]


def test_validate_eagle3_ref_wrong_schema_version() -> None:
    with pytest.raises(ValueError, match="schema_version must be 1"):
        validate_eagle3_ref(put(sample_tensors(0), schema_version=2))  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_draft_vocab_projection_is_the_references_to_the_bit(reference: Reference, dtype: torch.dtype) -> None:
    """``DraftVocab.project`` against the reference EAGLE-3 core's own projection (its remote server's too)."""
    core = importlib.import_module(f"{PREFIX}.eagle.core")
    generator = torch.Generator().manual_seed(0)
    vocab, draft = 96, 40
    ids = torch.randperm(vocab, generator=generator)[:draft]
    mask = torch.zeros(vocab, dtype=torch.bool)
    mask[ids] = True
    logits = (4 * torch.randn(3, 7, vocab, generator=generator)).to(dtype)
    loss_mask = torch.randint(0, 2, (3, 7), generator=generator)
    probs, position_mask = eagle3.DraftVocab(ids, mask).project(logits, loss_mask)
    their_probs, their_mask = core._compute_target_distribution(
        target_logits=logits, selected_token_ids=ids, selected_token_mask=mask, loss_mask=loss_mask
    )
    assert probs.dtype == their_probs.dtype and torch.equal(probs, their_probs)
    assert position_mask.dtype == their_mask.dtype and torch.equal(position_mask, their_mask)
    assert position_mask.any() and not position_mask.all()
