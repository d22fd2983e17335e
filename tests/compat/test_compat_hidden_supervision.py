"""The hidden-state encoding trains exactly as the logits: ``supervision="hidden"`` + ``TargetHead.from_model``.

The producer stores the target's last hidden state instead of its logits and the loader rebuilds the logits with
the head; every batch the loader yields must equal (``torch.equal``) the logits encoding's batch and the
reference's ``HFEagle3TargetModel`` batch, on tiny random-init Llama, Qwen2 and Qwen3 models, padded and packed,
f32 and bf16, tied and untied heads; the reference's EAGLE-3 and EAGLE-1/2 trainers step to bit-identical losses
and weights on both encodings.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="the HF backend tests need transformers: pip install 'featurestream[hf]'")

import transformers

from featurestream.eagle3 import DraftVocab, DraftVocabTarget
from featurestream.hf import HFDFlashTargetModel, HFEagle3TargetModel, HFEagleTargetModel
from featurestream.loader import FeatureDataLoader
from featurestream.pipeline.target_head import TargetHead
from featurestream.producer import FeatureProducer
from featurestream.queue import SampleRefQueue
from featurestream.refs import FeatureAlgorithm
from featurestream.stores.base import FeatureStore
from featurestream.stores.local import LocalFeatureStore
from featurestream.stores.shared_dir import SharedDirFeatureStore
from support.tiny import VOCAB, tiny_model

from .conftest import PREFIX, Reference
from .test_compat_hf import packed, padded

AUX = (1, 3, 4)
# (family, dtype, tied): each of Llama, Qwen2, Qwen3; f32 and bf16; tied and untied heads.
CASES = [("llama", torch.float32, False), ("qwen2", torch.bfloat16, True), ("qwen3", torch.bfloat16, False)]


def inputs() -> list[dict[str, torch.Tensor]]:
    return [padded(0), packed(1)]


def stream(
    target: Any,
    given: list[dict[str, torch.Tensor]],
    *,
    algorithm: FeatureAlgorithm | None = None,
    store: FeatureStore | None = None,
    **loader_options: Any,
) -> list[Any]:
    """Producer -> store -> queue -> ``FeatureDataLoader``: the batches the trainer gets, in order."""
    store = store or LocalFeatureStore()
    queue = SampleRefQueue(store)
    producer = FeatureProducer(target, store, run_id="hidden", algorithm=algorithm)
    for prompt in given:
        queue.put(producer.produce(**prompt))
    queue.close()
    with FeatureDataLoader(queue, store, algorithm=algorithm, prefetch=0, **loader_options) as loader:
        return [{name: tensor.clone() for name, tensor in batch.tensors().items()} for batch in loader]


def assert_equal_batches(got: list[dict[str, torch.Tensor]], expected: list[dict[str, torch.Tensor]]) -> None:
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected, strict=True):
        assert list(mine) == list(theirs)
        for name in theirs:
            assert mine[name].dtype == theirs[name].dtype and torch.equal(mine[name], theirs[name]), name


@pytest.mark.parametrize(("family", "dtype", "tied"), CASES)
def test_eagle3_hidden_batches_equal_the_logits_and_the_references(
    reference: Reference, family: str, dtype: torch.dtype, tied: bool
) -> None:
    model = tiny_model(family, layers=5, tied=tied, dtype=dtype)
    given = inputs()
    hidden = stream(
        HFEagle3TargetModel(model, AUX, supervision="hidden"), given, target_head=TargetHead.from_model(model)
    )
    assert_equal_batches(hidden, stream(HFEagle3TargetModel(model, AUX), given))
    theirs = reference.target.HFEagle3TargetModel(model, list(AUX))
    expected = []
    for prompt in given:
        batch = theirs.generate_batch(**prompt)
        expected.append({name: getattr(batch, name) for name in hidden[len(expected)]})
    assert_equal_batches(hidden, expected)
    assert hidden[0]["logits"].dtype == dtype


def test_the_draft_vocab_projection_of_rebuilt_logits_equals_the_producers(reference: Reference) -> None:
    model = tiny_model("qwen2", layers=5, dtype=torch.bfloat16)
    selected = torch.arange(0, VOCAB, 3)
    mask = torch.zeros(VOCAB, dtype=torch.bool)
    mask[selected] = True
    vocab = DraftVocab(selected, mask)
    given = inputs()
    expected = stream(DraftVocabTarget(HFEagle3TargetModel(model, AUX), vocab), given)
    hidden = stream(
        HFEagle3TargetModel(model, AUX, supervision="hidden"),
        given,
        target_head=TargetHead.from_model(model),
        draft_vocab=vocab,
    )
    assert "target_probs" in hidden[0] and "logits" not in hidden[0]
    assert_equal_batches(hidden, expected)


def draft_config(seed: int) -> transformers.LlamaConfig:
    """A one-layer Llama draft over the tiny target's vocabulary; seeds torch for the draft's initialisation."""
    torch.manual_seed(seed)
    return transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=32,
    )  # fmt: skip


def eagle3_trainer(seed: int) -> tuple[torch.nn.Module, Callable[[dict[str, torch.Tensor]], torch.Tensor]]:
    core = importlib.import_module(f"{PREFIX}.eagle.core")
    draft_llama = importlib.import_module(f"{PREFIX}.eagle.draft_llama")
    config = draft_config(seed)
    trainer = core.Eagle3TrainerModule(
        draft_llama.LlamaEagle3DraftModel(config),
        selected_token_ids=torch.arange(VOCAB),
        selected_token_mask=torch.ones(VOCAB, dtype=torch.bool),
        ttt_steps=2,
    )
    names = {"logits": "target_logits"}
    return trainer, lambda batch: trainer(**{names.get(k, k): v for k, v in batch.items()}).loss


def eagle12_trainer(
    seed: int, model: torch.nn.Module
) -> tuple[torch.nn.Module, Callable[[dict[str, torch.Tensor]], torch.Tensor]]:
    core = importlib.import_module(f"{PREFIX}.eagle.core_v12")
    draft = importlib.import_module(f"{PREFIX}.eagle.draft_llama_v12")
    config = draft_config(seed)
    trainer = core.EagleTrainerModule(draft.LlamaEagleDraftModel(config), target_lm_head=model.get_output_embeddings())
    return trainer, lambda batch: trainer(**batch).loss


def train(
    built: tuple[torch.nn.Module, Callable[[dict[str, torch.Tensor]], torch.Tensor]], batches: list[Any]
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    module, step = built
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-3)
    losses = []
    for batch in batches:
        optimizer.zero_grad()
        loss = step(batch)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses, {name: value.detach().clone() for name, value in module.state_dict().items()}


def assert_same_training(
    first: tuple[list[torch.Tensor], dict[str, torch.Tensor]],
    second: tuple[list[torch.Tensor], dict[str, torch.Tensor]],
) -> None:
    assert all(torch.equal(a, b) for a, b in zip(first[0], second[0], strict=True)), (first[0], second[0])
    assert first[1].keys() == second[1].keys()
    assert all(torch.equal(first[1][name], second[1][name]) for name in first[1])


def test_the_references_eagle3_trainer_steps_identically_on_both_encodings(
    reference: Reference, tmp_path: Path
) -> None:
    model = tiny_model("llama", layers=5)
    given = inputs()
    logits = stream(HFEagle3TargetModel(model, AUX), given)
    hidden = stream(
        HFEagle3TargetModel(model, AUX, supervision="hidden"),
        given,
        store=SharedDirFeatureStore(str(tmp_path)),
        target_head=TargetHead.from_model(model),
    )
    assert_same_training(train(eagle3_trainer(7), logits), train(eagle3_trainer(7), hidden))


@pytest.mark.parametrize(("family", "dtype", "tied"), CASES[:2])
def test_eagle12_hidden_batches_and_the_references_trainer_match_the_logits(
    reference: Reference, family: str, dtype: torch.dtype, tied: bool
) -> None:
    model = tiny_model(family, layers=4, tied=tied, dtype=dtype)
    given = inputs()
    logits = stream(HFEagleTargetModel(model), given, algorithm=FeatureAlgorithm.EAGLE)
    hidden = stream(
        HFEagleTargetModel(model, supervision="hidden"),
        given,
        algorithm=FeatureAlgorithm.EAGLE,
        target_head=TargetHead.from_model(model),
    )
    assert_equal_batches(hidden, [{n: t for n, t in batch.items()} for batch in logits])
    if dtype == torch.float32:
        assert_same_training(train(eagle12_trainer(5, model), logits), train(eagle12_trainer(5, model), hidden))


def test_dflash_hidden_batches_equal_the_captured_logits() -> None:
    model = tiny_model("qwen3", layers=4, tied=True, dtype=torch.bfloat16)
    given = inputs()
    logits = stream(HFDFlashTargetModel(model, [1, 2], capture_logits=True), given, algorithm=FeatureAlgorithm.DFLASH)
    hidden = stream(
        HFDFlashTargetModel(model, [1, 2], capture_logits=True, supervision="hidden"),
        given,
        algorithm=FeatureAlgorithm.DFLASH,
        target_head=TargetHead.from_model(model),
    )
    assert "logits" in hidden[0]
    assert_equal_batches(hidden, logits)
