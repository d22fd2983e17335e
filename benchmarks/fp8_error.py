"""What 8-bit hidden states cost: the error per feature, and the reference EAGLE-3 trainer's losses with and without.

    python benchmarks/fp8_error.py [--steps 20] [--family llama] [--dtype bfloat16]

A tiny random-init Hugging Face causal LM (hidden 32, vocabulary 128, 6
layers; no download) is the target: each step's prompts (2 rows of 32 tokens)
go producer -> ``LocalFeatureStore`` -> ``FeatureDataLoader`` twice, once
lossless and once with ``FeatureProducer(..., fp8=True)``, both with
``supervision="hidden"`` and the loader's ``TargetHead``. For each hidden-state
feature it prints the relative error per token, ``|x' - x| / |x|`` (L2 over
the token's hidden vector), max and mean over all tokens, and the largest
elementwise relative error among elements at least 1/16 of their token's
largest magnitude (smaller ones fall in e4m3's subnormal range, where the
error is absolute: at most 2^-10 of that magnitude). Then two copies of the
reference's ``Eagle3TrainerModule`` (same seed, AdamW lr 1e-2) step on the
two streams side by side, and their losses are printed per step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from featurestream import FeatureDataLoader, FeatureProducer, LocalFeatureStore, SampleRefQueue, TargetHead
from featurestream.pipeline.hf import HFEagle3TargetModel
from support.tiny import VOCAB, tiny_model

AUX = (1, 3, 4)
FEATURES = ("aux_hidden_states", "logits")


def batches(model: torch.nn.Module, prompts: list[torch.Tensor], *, fp8: bool) -> list[dict[str, torch.Tensor]]:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    producer = FeatureProducer(HFEagle3TargetModel(model, AUX, supervision="hidden"), store, run_id="fp8", fp8=fp8)
    ones = torch.ones_like(prompts[0])
    for input_ids in prompts:
        queue.put(producer.produce(input_ids=input_ids, attention_mask=ones, loss_mask=ones))
    queue.close()
    with FeatureDataLoader(queue, store, target_head=TargetHead.from_model(model), prefetch=0) as loader:
        return [{name: tensor.clone() for name, tensor in batch.tensors().items()} for batch in loader]


def errors(exact: torch.Tensor, lossy: torch.Tensor) -> tuple[float, float, float]:
    x, y = exact.float(), lossy.float()
    per_token = (y - x).norm(dim=-1) / x.norm(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)
    large = (x.abs() >= x.abs().amax(dim=-1, keepdim=True) / 16) & (x != 0)
    elementwise = ((y - x).abs() / x.abs())[large]
    return float(per_token.max()), float(per_token.mean()), float(elementwise.max())


def trainer(seed: int) -> torch.nn.Module:
    from nemo_automodel.components.speculative.eagle.core import Eagle3TrainerModule
    from nemo_automodel.components.speculative.eagle.draft_llama import LlamaEagle3DraftModel

    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(seed)
    return Eagle3TrainerModule(
        LlamaEagle3DraftModel(config),
        selected_token_ids=torch.arange(VOCAB),
        selected_token_mask=torch.ones(VOCAB, dtype=torch.bool),
        ttt_steps=2,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--family", default="llama", choices=["llama", "qwen2", "qwen3", "mistral"])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args()
    model = tiny_model(args.family, layers=6, dtype=getattr(torch, args.dtype))
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(VOCAB, (2, 32), generator=generator) for _ in range(args.steps)]
    exact, lossy = batches(model, prompts, fp8=False), batches(model, prompts, fp8=True)
    print(f"{args.family}, {args.dtype}, {args.steps} samples of 2 x 32 tokens")
    print()
    print("| feature | per-token relative error, max | mean | elementwise, max (elements >= amax/16) |")
    print("| --- | ---: | ---: | ---: |")
    for name in FEATURES:
        pairs = [errors(e[name], q[name]) for e, q in zip(exact, lossy, strict=True)]
        worst, mean, element = max(p[0] for p in pairs), sum(p[1] for p in pairs) / len(pairs), max(p[2] for p in pairs)
        label = name if name != "logits" else "logits (rebuilt from the 8-bit last hidden state)"
        print(f"| {label} | {worst:.4f} | {mean:.4f} | {element:.4f} |")
    print()
    names = {"logits": "target_logits"}
    losses = []
    for stream in (exact, lossy):
        module = trainer(7)
        optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-2)
        run = []
        for batch in stream:
            inputs = {names.get(k, k): v.float() if v.is_floating_point() else v for k, v in batch.items()}
            optimizer.zero_grad()
            loss = module(**inputs).loss
            loss.backward()
            optimizer.step()
            run.append(float(loss.detach()))
        losses.append(run)
    print("| step | loss, lossless | loss, fp8 | difference |")
    print("| ---: | ---: | ---: | ---: |")
    for step, (a, b) in enumerate(zip(*losses, strict=True), start=1):
        print(f"| {step} | {a:.6f} | {b:.6f} | {b - a:+.6f} |")


if __name__ == "__main__":
    main()
