"""``featurestream.hf`` against the reference's own ``HFEagle3TargetModel``: every field equal, bit for bit.

Tiny random-init Llama, Qwen2, Qwen3 and Mistral models (no download), right-padded and packed inputs; the
reference's batches carry ``logits``, ``input_ids`` and ``loss_mask`` shifted one position left (the EAGLE-3 token
alignment), and so must featurestream's.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="the HF backend tests need transformers: pip install 'featurestream[hf]'")

from featurestream.hf import HFEagle3TargetModel
from featurestream.tools.models import HF_FAMILIES, TinyConfig, tiny_hf_causal_lm

from .conftest import Reference, assert_takes_the_references_parameters

CONFIG = TinyConfig(vocab_size=96, hidden_size=32, num_layers=4, num_heads=4, max_seq_len=32)
FIELDS = (
    "aux_hidden_states", "input_ids", "attention_mask", "loss_mask", "logits", "target_probs", "position_mask",
    "position_ids", "seq_lens", "doc_remaining",
)  # fmt: skip


def padded(seed: int = 0) -> dict[str, torch.Tensor]:
    """Three rows of 12 tokens; the second and third right-padded; the first three tokens unsupervised."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(CONFIG.vocab_size, (3, 12), generator=generator)
    attention_mask = torch.ones(3, 12, dtype=torch.long)
    attention_mask[1, 8:] = 0
    attention_mask[2, 5:] = 0
    loss_mask = attention_mask.clone()
    loss_mask[:, :3] = 0
    return {"input_ids": input_ids * attention_mask, "attention_mask": attention_mask, "loss_mask": loss_mask}


def packed(seed: int = 0) -> dict[str, torch.Tensor]:
    """Two rows of 10 tokens packing 3 and 2 documents (positions restart per document)."""
    generator = torch.Generator().manual_seed(seed)
    seq_lens = torch.tensor([[4, 3, 3], [6, 4, 0]])
    position_ids = torch.cat([torch.cat([torch.arange(int(n)) for n in row if n]) for row in seq_lens]).view(2, 10)
    doc_remaining = torch.cat(
        [torch.cat([torch.arange(int(n) - 1, -1, -1) for n in row if n]) for row in seq_lens]
    ).view(2, 10)
    loss_mask = torch.ones(2, 10, dtype=torch.long)
    loss_mask[:, 0] = 0
    return {
        "input_ids": torch.randint(CONFIG.vocab_size, (2, 10), generator=generator),
        "attention_mask": torch.ones(2, 10, dtype=torch.long),
        "loss_mask": loss_mask,
        "position_ids": position_ids,
        "seq_lens": seq_lens,
        "doc_remaining": doc_remaining,
    }


def assert_identical(ours: Any, theirs: Any) -> None:
    for name in FIELDS:
        mine, expected = getattr(ours, name), getattr(theirs, name)
        assert (mine is None) == (expected is None), name
        if mine is not None:
            assert mine.dtype == expected.dtype and torch.equal(mine, expected), name


@pytest.mark.parametrize("inputs", [padded, packed], ids=["padded", "packed"])
@pytest.mark.parametrize("family", sorted(HF_FAMILIES))
def test_generate_batch_equals_the_references(reference: Reference, family: str, inputs: Any) -> None:
    model = tiny_hf_causal_lm(family, CONFIG, num_layers=8)
    ours, theirs = HFEagle3TargetModel(model), reference.target.HFEagle3TargetModel(model)
    assert list(ours.aux_layer_ids) == theirs.aux_layer_ids == [1, 3, 4]
    for seed in range(2):
        given = inputs(seed)
        assert_identical(ours.generate_batch(**given), theirs.generate_batch(**given))


def test_the_alignment_is_the_shift_of_one_unshifted_forward(reference: Reference) -> None:
    """What 'shifted' means, checked on the reference's batch: position t holds t + 1's logits, token and mask."""
    model = tiny_hf_causal_lm("llama", CONFIG, num_layers=8)
    given = padded()
    batch = HFEagle3TargetModel(model).generate_batch(**given)
    with torch.no_grad():
        logits = model(input_ids=given["input_ids"], attention_mask=given["attention_mask"]).logits
    for name, unshifted in (("logits", logits), ("input_ids", given["input_ids"]), ("loss_mask", given["loss_mask"])):
        tensor = getattr(batch, name)
        assert torch.equal(tensor[:, :-1], unshifted[:, 1:]) and not tensor[:, -1].any(), name
    assert torch.equal(batch.attention_mask, given["attention_mask"])


def test_explicit_layers_with_the_last_and_bfloat16_equal_the_references(reference: Reference) -> None:
    model = tiny_hf_causal_lm("qwen3", CONFIG, num_layers=8).to(torch.bfloat16)
    ids = [7, 0, 5]
    ours, theirs = HFEagle3TargetModel(model, aux_layer_ids=ids), reference.target.HFEagle3TargetModel(model, ids)
    for given in (padded(), packed()):
        batch = ours.generate_batch(**given)
        assert batch.logits is not None and batch.logits.dtype == torch.bfloat16
        assert_identical(batch, theirs.generate_batch(**given))


def test_the_constructor_and_generate_batch_take_the_references_arguments(reference: Reference) -> None:
    ours, theirs = HFEagle3TargetModel, reference.target.HFEagle3TargetModel
    assert_takes_the_references_parameters(ours, theirs)
    assert list(inspect.signature(ours.generate_batch).parameters) == list(
        inspect.signature(theirs.generate_batch).parameters
    )
    model = tiny_hf_causal_lm("mistral", CONFIG, num_layers=8)
    given = padded()
    positional = (given["input_ids"], given["attention_mask"], given["loss_mask"])
    assert_identical(ours(model, None, None).generate_batch(*positional), theirs(model).generate_batch(*positional))

    class Mesh:
        def __init__(self, size: int) -> None:
            self._size = size

        def size(self) -> int:
            return self._size

    assert ours(model, cp_mesh=Mesh(1)).aux_layer_ids == (1, 3, 4), "a mesh of one rank shards nothing"
    with pytest.raises(ValueError, match=r"context-parallel mesh of size 2"):
        ours(model, cp_mesh=Mesh(2))
