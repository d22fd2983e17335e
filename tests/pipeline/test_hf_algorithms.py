"""The DFlash, DSpark and EAGLE-1/2 Hugging Face wrappers: one hooked forward, their checks, and the whole pipeline.

Bit-for-bit parity with the reference's wrappers is ``tests/compat/test_compat_hf_algorithms.py``; the capture
machinery they share with ``HFEagle3TargetModel`` (hooks removed, eval restored, no grad, threads) is
``test_hf_backend.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="the HF backend tests need transformers: pip install 'featurestream[hf]'")

from featurestream.hf import HFDFlashTargetModel, HFDSparkTargetModel, HFEagleTargetModel
from featurestream.loader import FeatureDataLoader
from featurestream.pipeline.dflash import DFlashTargetBatch
from featurestream.pipeline.dspark import DSparkTargetBatch
from featurestream.pipeline.eagle12 import EagleTargetBatch
from featurestream.producer import FeatureProducer
from featurestream.queue import SampleRefQueue
from featurestream.refs import FeatureAlgorithm
from featurestream.stores.local import LocalFeatureStore
from support.tiny import HIDDEN, VOCAB, hook_count, prompts, shifted, tiny_model

Build = Callable[[torch.nn.Module], Any]
WRAPPERS: dict[FeatureAlgorithm, tuple[Build, type]] = {
    FeatureAlgorithm.DFLASH: (lambda model: HFDFlashTargetModel(model, [2, 7], capture_logits=True), DFlashTargetBatch),
    FeatureAlgorithm.DSPARK: (lambda model: HFDSparkTargetModel(model, [-1, 3, 7]), DSparkTargetBatch),
    FeatureAlgorithm.EAGLE: (HFEagleTargetModel, EagleTargetBatch),
}


def packed_prompt() -> dict[str, torch.Tensor]:
    """One row of 10 tokens packing documents of 6 and 4 tokens."""
    seq_lens = torch.tensor([[6, 4]])
    return {
        "input_ids": torch.arange(10).view(1, 10) * 7 % VOCAB,
        "attention_mask": torch.ones(1, 10, dtype=torch.long),
        "loss_mask": torch.ones(1, 10, dtype=torch.long),
        "position_ids": torch.cat([torch.arange(6), torch.arange(4)]).view(1, 10),
        "seq_lens": seq_lens,
        "doc_remaining": torch.cat([torch.arange(5, -1, -1), torch.arange(3, -1, -1)]).view(1, 10),
    }


@pytest.mark.parametrize("algorithm", sorted(WRAPPERS))
def test_the_producer_infers_the_algorithm_and_the_loader_yields_what_generate_batch_returns(
    algorithm: FeatureAlgorithm,
) -> None:
    build, batch_type = WRAPPERS[algorithm]
    target = build(tiny_model("llama"))
    input_ids, attention_mask, loss_mask = prompts()
    given = [{"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}, packed_prompt()]
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    producer = FeatureProducer(target, store, run_id="hf-algorithms")
    assert producer.algorithm is algorithm
    for inputs in given:
        queue.put(producer.produce(**inputs))
    queue.close()
    with FeatureDataLoader(queue, store, algorithm=algorithm) as loader:
        streamed = [{name: batch[name].clone() for name in batch.keys()} for batch in loader]
    assert queue.stats().acked == len(given) and store.health().sample_count == 0
    for inputs, got in zip(given, streamed, strict=True):
        direct = target.generate_batch(**inputs)
        assert isinstance(direct, batch_type)
        assert list(got) == direct.keys()
        for name in got:
            assert got[name].dtype == direct[name].dtype and torch.equal(got[name], direct[name]), name


@pytest.mark.parametrize("algorithm", sorted(WRAPPERS))
def test_one_forward_per_batch_without_output_hidden_states_and_no_hook_left(algorithm: FeatureAlgorithm) -> None:
    model = tiny_model("qwen3")
    target = WRAPPERS[algorithm][0](model)
    baseline = hook_count(model), sum(len(m._forward_pre_hooks) for m in model.modules())
    calls: list[dict[str, Any]] = []
    model.register_forward_pre_hook(lambda module, args, kwargs: calls.append(kwargs), with_kwargs=True)
    target.generate_batch(*prompts())
    assert len(calls) == 1 and calls[0]["output_hidden_states"] is False and calls[0]["use_cache"] is False
    assert (hook_count(model), sum(len(m._forward_pre_hooks) for m in model.modules()) - 1) == baseline


def test_the_lm_head_runs_on_one_position_unless_dflash_captures_the_logits() -> None:
    model = tiny_model("llama")
    widths: list[int] = []
    model.lm_head.register_forward_hook(lambda module, args, output: widths.append(output.shape[1]))
    input_ids, attention_mask, loss_mask = prompts(length=12)
    assert HFDFlashTargetModel(model, [1]).generate_batch(input_ids, attention_mask, loss_mask).logits is None
    HFDSparkTargetModel(model, [1]).generate_batch(input_ids, attention_mask, loss_mask)
    batch = HFDFlashTargetModel(model, [1], capture_logits=True).generate_batch(input_ids, attention_mask, loss_mask)
    assert batch.logits is not None and batch.logits.shape == (2, 12, VOCAB)
    assert widths == [1, 1, 12]


def test_dspark_features_follow_the_offset_one_convention() -> None:
    model = tiny_model("qwen2")
    input_ids, attention_mask, loss_mask = prompts()
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    batch = HFDSparkTargetModel(model, [-1, 0, 7]).generate_batch(input_ids, attention_mask, loss_mask)
    # hidden_states[0] is the embedding output, [i + 1] layer i's output, [8] (for the last layer) post-norm.
    expected = torch.cat([out.hidden_states[0], out.hidden_states[1], out.hidden_states[8]], dim=-1)
    assert torch.equal(batch.target_hidden_states, expected)
    assert torch.equal(batch.target_last_hidden_states, out.hidden_states[8])
    assert torch.equal(batch.input_ids, input_ids) and torch.equal(batch.loss_mask, loss_mask), "not shifted"


def test_eagle12_supervision_is_the_next_positions_state_logits_and_token() -> None:
    model = tiny_model("llama")
    input_ids, attention_mask, loss_mask = prompts()
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    batch = HFEagleTargetModel(model).generate_batch(input_ids, attention_mask, loss_mask)
    assert batch.input_hidden_states.shape == (2, 12, HIDDEN)
    assert torch.equal(batch.input_hidden_states, out.hidden_states[-1])
    assert torch.equal(batch.target_hidden_states, shifted(out.hidden_states[-1]))
    assert torch.equal(batch.target_logits, shifted(out.logits))
    assert torch.equal(batch.input_ids, shifted(input_ids)) and torch.equal(batch.loss_mask, shifted(loss_mask))
    assert torch.equal(batch.attention_mask, attention_mask)
    assert HFEagleTargetModel(model).get_lm_head() is model.lm_head


class WrongFeatureModules(torch.nn.Module):
    """A model whose ``get_dspark_target_feature_modules`` returns one module too few."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = tiny_model("llama")
        self.model = self.inner.model

    def get_dspark_target_feature_modules(self, layer_ids: list[int]) -> tuple[torch.nn.Module, ...]:
        return tuple(self.model.layers[: len(layer_ids) - 1])


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda m: HFDFlashTargetModel(m, []), ValueError, r"target_layer_ids must name at least one layer"),
        (lambda m: HFDFlashTargetModel(m, [1, 8]), ValueError, r"target layer id 8 is out of range .* 8 decoder"),
        (lambda m: HFDFlashTargetModel(m, [-1]), ValueError, r"target layer id -1 is out of range"),
        (lambda m: HFDFlashTargetModel(m, [3, 3]), ValueError, r"distinct layers, got 3 twice"),
        (lambda m: HFDFlashTargetModel(m, [1], capture_logits="yes"), TypeError, r"capture_logits must be a bool"),
        (lambda m: HFDSparkTargetModel(m, [3, 1]), ValueError, r"strictly increasing, got \[3, 1\]"),
        (lambda m: HFDSparkTargetModel(m, [-2]), ValueError, r"-2 is out of range .* or -1, the embedding output"),
        (lambda m: HFDSparkTargetModel(m, [1], cp_mesh=_Mesh(2)), ValueError, r"context-parallel mesh of size 2"),
        (lambda m: HFEagleTargetModel(m.model), ValueError, r"LlamaModel has no LM head"),
        (lambda m: HFDSparkTargetModel(WrongFeatureModules(), [0, 1]), ValueError, r"one nn.Module per layer id"),
    ],
)
def test_bad_arguments_are_refused_by_name(build: Build, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        build(tiny_model("llama"))


class _Mesh:
    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size


@pytest.mark.parametrize("algorithm", sorted(WRAPPERS))
def test_packing_without_position_ids_is_refused(algorithm: FeatureAlgorithm) -> None:
    inputs = packed_prompt()
    inputs["position_ids"] = None
    with pytest.raises(ValueError, match=r"packed inputs \(seq_lens given\) need per-document position_ids"):
        WRAPPERS[algorithm][0](tiny_model("llama")).generate_batch(**inputs)
