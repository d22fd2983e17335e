"""Stored bytes per token of an EAGLE-3 sample: full-vocabulary ``logits`` against the draft-vocabulary encoding.

    python benchmarks/bench_draft_vocab_bytes.py [--hidden 4096] [--vocab 151936] [--draft 32000]

Sizes, not timings: for a named target shape (default: an 8B model with Qwen's 151,936-token vocabulary, hidden
size 4096, three auxiliary layers captured in bfloat16, and a 32,000-token draft vocabulary) one sample of a few
tokens is produced through ``FeatureProducer`` into a ``LocalFeatureStore`` twice -- once storing the target's
``logits``, once through ``DraftVocabTarget`` (``target_probs`` float32 + ``position_mask`` bool) -- and the
bytes per token are read off the stored refs (``FeatureSpec.nbytes``), for float32 and bfloat16 logits. The
ratio column is logits / draft-vocab: of the supervision alone, and of the whole sample (the auxiliary hidden
states and the three int64 columns are the same in both).
"""

from __future__ import annotations

import argparse

import torch

from featurestream import FeatureProducer, LocalFeatureStore
from featurestream.common.refs import SampleRef
from featurestream.pipeline.eagle3 import DraftVocab, DraftVocabTarget, Eagle3TargetBackend, Eagle3TargetBatch

TOKENS = 4
SUPERVISION = {"logits": ("logits",), "draft": ("target_probs", "position_mask")}


class ShapedTarget(Eagle3TargetBackend):
    """A stand-in target of the named shape: random aux hidden states and logits, nothing computed."""

    def __init__(self, hidden: int, vocab: int, logits_dtype: torch.dtype) -> None:
        self.hidden, self.vocab, self.logits_dtype = hidden, vocab, logits_dtype

    def generate_batch(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
                       **packing: torch.Tensor | None) -> Eagle3TargetBatch:  # fmt: skip
        batch, tokens = input_ids.shape
        return Eagle3TargetBatch(
            aux_hidden_states=torch.randn(batch, tokens, 3 * self.hidden, dtype=torch.bfloat16),
            input_ids=input_ids.clone(),
            attention_mask=attention_mask.clone(),
            loss_mask=loss_mask.clone(),
            logits=torch.randn(batch, tokens, self.vocab, dtype=self.logits_dtype),
        )


def per_token(ref: SampleRef, names: tuple[str, ...] | None = None) -> float:
    specs = ref.feature_specs if names is None else {name: ref.feature_specs[name] for name in names}
    return sum(spec.nbytes for spec in specs.values()) / TOKENS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--draft", type=int, default=32_000)
    args = parser.parse_args()
    mask = torch.zeros(args.vocab, dtype=torch.bool)
    mask[: args.draft] = True
    vocab = DraftVocab(torch.arange(args.draft), mask)
    prompt = {
        "input_ids": torch.randint(0, args.vocab, (1, TOKENS)),
        "attention_mask": torch.ones(1, TOKENS, dtype=torch.long),
        "loss_mask": torch.ones(1, TOKENS, dtype=torch.long),
    }
    print(f"target: hidden {args.hidden}, 3 aux layers (bf16), vocabulary {args.vocab}; draft vocabulary {args.draft}")
    print(f"{'logits dtype':<14}{'encoding':<10}{'supervision B/tok':>19}{'sample B/tok':>14}")
    for dtype in (torch.float32, torch.bfloat16):
        store = LocalFeatureStore(max_bytes=1 << 30)
        target = ShapedTarget(args.hidden, args.vocab, dtype)
        refs = {
            "logits": FeatureProducer(target, store, run_id="full").produce(**prompt),
            "draft": FeatureProducer(DraftVocabTarget(target, vocab), store, run_id="draft").produce(**prompt),
        }
        for encoding, ref in refs.items():
            print(
                f"{str(dtype).removeprefix('torch.'):<14}{encoding:<10}"
                f"{per_token(ref, SUPERVISION[encoding]):>19,.0f}{per_token(ref):>14,.0f}"
            )
        supervision = per_token(refs["logits"], SUPERVISION["logits"]) / per_token(refs["draft"], SUPERVISION["draft"])
        whole = per_token(refs["logits"]) / per_token(refs["draft"])
        print(f"{'':<14}{'ratio':<10}{supervision:>18.2f}x{whole:>13.2f}x")


if __name__ == "__main__":
    main()
