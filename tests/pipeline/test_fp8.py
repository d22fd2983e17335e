"""Opt-in 8-bit hidden states: stored as float8_e4m3fn with per-token scales, dequantised by the loader."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("transformers", reason="the fp8 tests need transformers: pip install 'featurestream[hf]'")

from featurestream.backends.memory.queue import SampleRefQueue
from featurestream.common.refs import SampleRef
from featurestream.pipeline.fp8 import dequantize, quantize
from featurestream.pipeline.hf import HFEagle3TargetModel
from featurestream.pipeline.loader import FeatureDataLoader
from featurestream.pipeline.producer import FeatureProducer
from featurestream.pipeline.target_head import TargetHead
from featurestream.stores.local import LocalFeatureStore
from support.tiny import prompts, tiny_model

AUX = (1, 3, 4)


def stream(target: HFEagle3TargetModel, *, fp8: bool, head: TargetHead | None = None) -> tuple[SampleRef, dict]:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    input_ids, attention_mask, loss_mask = prompts()
    ref = FeatureProducer(target, store, run_id="r", fp8=fp8).produce(
        input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask
    )
    queue.put(ref)
    queue.close()
    with FeatureDataLoader(queue, store, target_head=head, prefetch=0) as loader:
        (batch,) = [{name: tensor.clone() for name, tensor in b.tensors().items()} for b in loader]
    return ref, batch


def assert_within_e4m3(got: torch.Tensor, exact: torch.Tensor) -> None:
    """e4m3 keeps 3 mantissa bits: a normal value is off by at most 1/16 of itself, a subnormal one by half the
    smallest step (2^-10 of the token's scale); the dequantised value's own rounding to ``exact.dtype`` adds one
    step of it."""
    exact32, got32 = exact.float(), got.float()
    scale = exact32.abs().amax(dim=-1, keepdim=True) / 448
    bound = exact32.abs() * (1 / 16 + torch.finfo(exact.dtype).eps) + scale * 2**-9
    assert got.dtype == exact.dtype and bool(((got32 - exact32).abs() <= bound).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hidden_states_come_back_in_their_dtype_within_e4m3s_error(dtype: torch.dtype) -> None:
    model = tiny_model("llama", layers=5, dtype=dtype)
    head = TargetHead.from_model(model)
    _, exact = stream(HFEagle3TargetModel(model, AUX, supervision="hidden"), fp8=False, head=head)
    ref, lossy = stream(HFEagle3TargetModel(model, AUX, supervision="hidden"), fp8=True, head=head)
    assert ref.feature_specs["aux_hidden_states"].dtype == torch.float8_e4m3fn
    assert ref.feature_specs["aux_hidden_states_fp8_scale"].shape == (2, 12, 1)
    assert (ref.provenance or {})["fp8"] == f"aux_hidden_states:{str(dtype)[6:]},last_hidden_states:{str(dtype)[6:]}"
    assert list(lossy) == list(exact)
    assert_within_e4m3(lossy["aux_hidden_states"], exact["aux_hidden_states"])
    for name in ("input_ids", "attention_mask", "loss_mask"):
        assert torch.equal(lossy[name], exact[name])
    assert not torch.equal(lossy["logits"], exact["logits"])  # rebuilt from the 8-bit state: close, not equal


def test_fp8_leaves_logits_alone_and_is_off_by_default() -> None:
    model = tiny_model("qwen2", layers=5, dtype=torch.bfloat16)
    plain_ref, exact = stream(HFEagle3TargetModel(model, AUX), fp8=False)
    assert plain_ref.provenance == {}
    ref, lossy = stream(HFEagle3TargetModel(model, AUX), fp8=True)
    assert ref.feature_specs["logits"].dtype == torch.bfloat16 and torch.equal(lossy["logits"], exact["logits"])
    assert_within_e4m3(lossy["aux_hidden_states"], exact["aux_hidden_states"])


def test_quantize_round_trips_zeros_and_extremes() -> None:
    x = torch.tensor([[[0.0, 0.0, 0.0], [1e-30, -3e4, 2.5]]], dtype=torch.float32)
    stored, provenance = quantize({"aux_hidden_states": x, "input_ids": torch.zeros(1, 2, dtype=torch.long)})
    assert provenance == {"fp8": "aux_hidden_states:float32"} and list(stored)[1] == "aux_hidden_states_fp8_scale"
    ref = type("Ref", (), {"provenance": provenance})()
    back = dequantize(ref, stored)  # type: ignore[arg-type]
    assert list(back) == ["aux_hidden_states", "input_ids"]
    assert torch.equal(back["aux_hidden_states"][0, 0], torch.zeros(3)) and back["aux_hidden_states"][0, 1, 1] == -3e4


def test_a_ref_whose_8bit_feature_lacks_its_scale_is_refused() -> None:
    model = tiny_model("llama", layers=5)
    ref, _ = stream(HFEagle3TargetModel(model, AUX), fp8=True)
    specs = {name: spec for name, spec in ref.feature_specs.items() if name != "aux_hidden_states_fp8_scale"}
    keys = {name: ref.feature_keys[name] for name in specs}
    with pytest.raises(ValueError, match="8-bit copy of a float32 feature"):
        dataclasses.replace(ref, feature_specs=specs, feature_keys=keys)
