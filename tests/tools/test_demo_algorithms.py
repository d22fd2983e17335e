"""``featurestream demo --algorithm dflash|dspark``: a tiny draft head of each algorithm trains through the queue.

The EAGLE-3 demo (the default) is ``test_demo.py``; the Hugging Face targets of each algorithm are
``tests/tools/test_hf_demo.py``.
"""

from __future__ import annotations

import re

import pytest
import torch

from featurestream.cli import main
from featurestream.tools.demo import BATCH_SIZE, SEQ_LEN, token_bytes
from featurestream.tools.models import TinyConfig, TinyDFlashDraft, TinyDSparkDraft, TinyDSparkTarget

FAST = ["--samples", "48", "--crash-every", "15", "--fail-rate", "0.1", "--visibility-timeout", "0.3", "--seed", "3"]


@pytest.mark.parametrize(("algorithm", "draft"), [("dflash", "TinyDFlashDraft"), ("dspark", "TinyDSparkDraft")])
def test_each_algorithms_draft_trains_end_to_end_and_the_summary_checks_pass(
    algorithm: str, draft: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--algorithm", algorithm, "--no-progress", *FAST]) == 0
    out = capsys.readouterr().out
    assert "FAILED" not in out and out.count("[ok]") == 6 and "[ok] the draft's loss fell" in out, out
    assert f"algorithm             {algorithm}: draft head {draft}" in out
    first, last = map(float, re.search(r"draft loss\s+first (\S+) -> last (\S+)", out).groups())
    assert last < first
    # The store moved this algorithm's samples: float32 states and int64 ids/masks, no logits (unlike EAGLE-3).
    moved = float(re.search(r"bytes moved\s+(\S+) MB through the store", out).group(1))
    expected = 48 * BATCH_SIZE * SEQ_LEN * token_bytes(algorithm, TinyConfig())
    assert moved == round(expected / 1e6, 1) and expected < 48 * BATCH_SIZE * SEQ_LEN * token_bytes(
        "eagle3", TinyConfig()
    )
    reclaimed, crashes = map(int, re.search(r"(\d+) leases reclaimed after (\d+) consumer crashes", out).groups())
    assert reclaimed >= crashes >= 2


def test_the_mooncake_store_runs_eagle3_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--algorithm", "dflash", "--store", "mooncake", "--samples", "4"]) == 2
    assert "--store mooncake runs --algorithm eagle3 only, got dflash" in capsys.readouterr().err


def test_a_drafted_block_is_supervised_inside_the_sequence_and_the_anchors_document_only() -> None:
    draft = TinyDFlashDraft(TinyConfig(vocab_size=16, hidden_size=8, num_heads=2), block_size=2)
    input_ids = torch.tensor([[1, 2, 3, 4, 5]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    targets, weights = draft.block_weights(input_ids, mask, doc_remaining=None)
    assert targets[0].tolist() == [[2, 3], [3, 4], [4, 5], [5, 0], [0, 0]]
    assert weights[0].tolist() == [[1, 1], [1, 1], [1, 0], [0, 0], [0, 0]], "token 5 is masked, 6 and 7 do not exist"
    doc_remaining = torch.tensor([[2, 1, 0, 1, 0]])  # documents [1, 2, 3] and [4, 5]
    _, packed = draft.block_weights(input_ids, torch.ones_like(mask), doc_remaining)
    assert packed[0].tolist() == [[1, 1], [1, 0], [0, 0], [1, 0], [0, 0]]


def test_the_dspark_draft_needs_a_target_lm_head_of_its_shape() -> None:
    config = TinyConfig()
    target = TinyDSparkTarget(config)
    draft = TinyDSparkDraft(config, target_lm_head=target.get_output_embeddings())
    assert torch.equal(draft.target_lm_head.weight, target.get_output_embeddings().weight)
    assert not draft.target_lm_head.weight.requires_grad, "the copy is frozen"
    with pytest.raises(ValueError, match=r"target_lm_head must have a weight of shape \(256, 64\)"):
        TinyDSparkDraft(config, target_lm_head=torch.nn.Linear(64, 10))
