"""The reference's own DFlash and DSpark trainers train from streamed batches exactly as from their target.

A recipe steps the reference's ``DFlashTrainerModule`` / ``DSparkTrainerModule`` (tiny Qwen3 drafts over a tiny
Qwen3 target, CPU, SDPA) on the target's batches. Here the same trainer, built from the same seed, steps once on
batches taken straight from ``generate_batch`` and once on the same prompts sent producer -> store -> queue ->
``FeatureDataLoader``; each step's loss (and the trained weights) must agree to the last bit. The target is
featurestream's wrapper or the reference's own (which the producer takes unchanged), the store in-process or a
shared directory (tensors written to files and read back), and the steps mix padded and packed batches.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="the trainer tests need transformers: pip install 'featurestream[hf]'")

from featurestream.hf import HFDFlashTargetModel, HFDSparkTargetModel
from featurestream.loader import FeatureDataLoader
from featurestream.producer import FeatureProducer
from featurestream.queue import SampleRefQueue
from featurestream.stores.base import FeatureStore
from featurestream.stores.local import LocalFeatureStore
from featurestream.stores.shared_dir import SharedDirFeatureStore
from featurestream.tools.models import TinyConfig, prompt_batches, tiny_hf_causal_lm

from .conftest import PREFIX, Reference
from .reference_trainers import dflash_trainer_module

CONFIG = TinyConfig(vocab_size=96, hidden_size=32, num_layers=4, num_heads=4, max_seq_len=32)
TARGET_LAYERS = 6
LAYER_IDS = [1, 3]
BLOCK = 4
MASK_TOKEN = CONFIG.vocab_size - 1
STEPS = 4


def prompts() -> Iterator[dict[str, torch.Tensor]]:
    """``STEPS`` batches: padded rows of 16 tokens, and every other one packing two documents per row."""
    for step, (input_ids, attention_mask, loss_mask) in enumerate(
        prompt_batches(STEPS, batch_size=2, seq_len=16, vocab_size=MASK_TOKEN, seed=3)
    ):
        if step % 2 == 0:
            yield {"input_ids": input_ids, "attention_mask": attention_mask, "loss_mask": loss_mask}
            continue
        seq_lens = torch.tensor([[9, 7], [10, 6]])
        yield {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(attention_mask),
            "loss_mask": torch.ones_like(loss_mask),
            "position_ids": torch.stack([torch.cat([torch.arange(int(n)) for n in row]) for row in seq_lens]),
            "seq_lens": seq_lens,
            "doc_remaining": torch.stack(
                [torch.cat([torch.arange(int(n) - 1, -1, -1) for n in row]) for row in seq_lens]
            ),
        }


def reference_module(name: str) -> Any:
    """``nemo_automodel.components.speculative.<name>`` (the ``reference`` fixture proves the package imports)."""
    return importlib.import_module(f"{PREFIX}.{name}")


def dflash_trainer(target: torch.nn.Module) -> tuple[torch.nn.Module, Callable[[Any], torch.Tensor]]:
    trainer = dflash_trainer_module(
        target, layer_ids=LAYER_IDS, num_target_layers=TARGET_LAYERS, mask_token_id=MASK_TOKEN, block_size=BLOCK
    )

    def step(batch: Any) -> torch.Tensor:  # the reference recipe's call (train_dflash._run_trainer_step)
        return trainer(
            input_ids=batch.input_ids,
            hidden_states=batch.hidden_states,
            loss_mask=batch.loss_mask,
            position_ids=batch.position_ids,
            seq_lens=batch.seq_lens,
            doc_remaining=batch.doc_remaining,
        ).loss

    return trainer.draft_model, step


class _Args(dict[str, Any]):
    """The recipe's model arguments as the reference's ``build_draft_config`` reads them (keys and attributes)."""

    __getattr__ = dict.__getitem__


def dspark_trainer(target: torch.nn.Module) -> tuple[torch.nn.Module, Callable[[Any], torch.Tensor]]:
    config_module, draft_qwen3, core = (
        reference_module(f"dspark.{name}") for name in ("config", "draft_qwen3", "core")
    )
    arguments = _Args(
        num_draft_layers=1,
        target_layer_ids=LAYER_IDS,
        block_size=BLOCK,
        mask_token_id=MASK_TOKEN,
        num_anchors=8,
        confidence_head_alpha=1.0,
        confidence_head_with_markov=False,
        markov_rank=4,
        markov_head_type="vanilla",
    )
    config = config_module.build_draft_config(target.config, arguments)
    config._attn_implementation = "sdpa"  # the recipe's flex_attention has no CPU kernel
    draft = draft_qwen3.Qwen3DSparkModel(config)
    draft.initialize_embeddings_and_head(
        embed_tokens=target.get_input_embeddings(), lm_head=target.get_output_embeddings()
    )
    trainer = core.DSparkTrainerModule(draft)

    def step(batch: Any) -> torch.Tensor:
        return trainer(
            input_ids=batch.input_ids,
            target_hidden_states=batch.target_hidden_states,
            loss_mask=batch.loss_mask,
            target_last_hidden_states=batch.target_last_hidden_states,
            position_ids=batch.position_ids,
            seq_lens=batch.seq_lens,
            doc_remaining=batch.doc_remaining,
        ).loss

    return draft, step


ALGORITHMS = {
    "dflash": (HFDFlashTargetModel, "dflash.target", dflash_trainer),
    "dspark": (HFDSparkTargetModel, "dspark.target", dspark_trainer),
}


def train(target: torch.nn.Module, algorithm: str, batches: list[Any]) -> tuple[list[torch.Tensor], torch.nn.Module]:
    """Each step's loss of a freshly seeded trainer stepping AdamW on ``batches``, and the trained draft."""
    torch.manual_seed(0)
    draft, step = ALGORITHMS[algorithm][2](target)
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=1e-3)
    losses = []
    for index, batch in enumerate(batches):
        torch.manual_seed(100 + index)  # the anchors each step samples
        loss = step(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses, draft


def streamed(backend: Any, store: FeatureStore) -> list[Any]:
    """The prompts through producer -> store -> queue -> loader, each batch's tensors copied out before its ack."""
    queue = SampleRefQueue(store)
    producer = FeatureProducer(backend, store, run_id="trainers")
    for given in prompts():
        queue.put(producer.produce(**given))
    queue.close()
    with FeatureDataLoader(queue, store, algorithm=producer.algorithm) as loader:
        batches = [type(batch)(**{name: batch[name].clone() for name in batch.keys()}) for batch in loader]
    assert queue.stats().acked == STEPS and store.health().sample_count == 0
    return batches


@pytest.mark.parametrize("store", ["local", "shared-dir"])
@pytest.mark.parametrize("wrapper", ["featurestream", "reference"])
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_the_references_trainer_loses_the_same_on_streamed_batches(
    reference: Reference, algorithm: str, wrapper: str, store: str, tmp_path: Any
) -> None:
    model = tiny_hf_causal_lm("qwen3", CONFIG, num_layers=TARGET_LAYERS)
    ours, module_name, _ = ALGORITHMS[algorithm]
    module = reference_module(module_name)  # imported, as a recipe does: the loader then yields its batch class
    backend = (ours if wrapper == "featurestream" else getattr(module, ours.__name__))(model, LAYER_IDS)
    direct = [backend.generate_batch(**given) for given in prompts()]
    from_stream = streamed(backend, LocalFeatureStore() if store == "local" else SharedDirFeatureStore(tmp_path))
    reference_batch = getattr(module, type(direct[0]).__name__)
    assert all(isinstance(batch, reference_batch) for batch in from_stream), "the recipe's own batch class"

    direct_losses, direct_draft = train(model, algorithm, direct)
    streamed_losses, streamed_draft = train(model, algorithm, from_stream)
    assert all(loss.isfinite() for loss in direct_losses) and len(set(map(float, direct_losses))) == STEPS
    assert [loss.item() for loss in streamed_losses] == [loss.item() for loss in direct_losses]
    assert all(torch.equal(a, b) for a, b in zip(streamed_losses, direct_losses, strict=True)), "to the last bit"
    for (name, mine), theirs in zip(
        streamed_draft.state_dict().items(), direct_draft.state_dict().values(), strict=True
    ):
        assert torch.equal(mine, theirs), name
