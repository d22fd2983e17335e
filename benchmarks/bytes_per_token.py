"""Bytes per token each algorithm streams for a named target shape, measured through the producer and the stores.

    python benchmarks/bytes_per_token.py [--model llama-3.1-8b] [--tokens 256]

For each algorithm a backend hands ``FeatureProducer`` one batch of the
target's shape (``[1, tokens, ...]``: states and logits in bfloat16, as a
bf16 target computes them; ids and masks int64, as Hugging Face collators
give them; no packing metadata) and the producer stores it, once in a
``LocalFeatureStore`` (the tensors' bytes: ``SampleRef.estimated_bytes``) and
once in a ``SharedDirFeatureStore`` (the bytes of the files it writes, headers
included). Each is divided by the token count. The layers captured are the
reference recipes' defaults: EAGLE-3's three auxiliary layers, DFlash's and
DSpark's one target layer per draft layer for a five-layer draft. The draft-vocab
row projects EAGLE-3's logits onto a 32k draft vocabulary before storing
(``DraftVocabTarget``: ``target_probs`` float32 + ``position_mask``). The
last-hidden-state rows store EAGLE-3's supervision as the target's last
hidden state (``supervision="hidden"``: a ``HiddenSupervised`` batch; the
trainer's loader rebuilds the logits with the ``TargetHead``), lossless, and
with the hidden states stored as ``float8_e4m3fn`` with per-token scales
(``FeatureProducer(..., fp8=True)``).

This is arithmetic made visible rather than a timing: the numbers depend on
the shape only, and the script prints them as the Markdown table
``docs/algorithms.md`` quotes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch

from featurestream import LocalFeatureStore, SharedDirFeatureStore
from featurestream.pipeline.dflash import DFlashTargetBatch
from featurestream.pipeline.dspark import DSparkTargetBatch
from featurestream.pipeline.eagle3 import DraftVocab, DraftVocabTarget, Eagle3TargetBatch
from featurestream.pipeline.eagle12 import EagleTargetBatch
from featurestream.pipeline.producer import FeatureProducer
from featurestream.pipeline.supervision import HiddenSupervised
from featurestream.pipeline.target_head import TargetHead
from featurestream.stores.base import FeatureStore

DRAFT_VOCAB = 32_000
DRAFT_LAYERS = 5  # the DFlash and DSpark recipes' default draft depth: one target layer per draft layer


@dataclasses.dataclass(frozen=True)
class Shape:
    """A target's hidden size, vocabulary and depth."""

    hidden: int
    vocab: int
    layers: int


SHAPES = {
    "llama-3.1-8b": Shape(hidden=4096, vocab=128_256, layers=32),
    "qwen3-8b": Shape(hidden=4096, vocab=151_936, layers=36),
    "llama-3.1-70b": Shape(hidden=8192, vocab=128_256, layers=80),
}


class FixedTarget:
    """A backend whose every ``generate_batch`` returns the same prebuilt batch."""

    def __init__(self, batch: object) -> None:
        self.batch = batch

    def generate_batch(self, **inputs: Any) -> object:
        return self.batch


def states(tokens: int, width: int) -> torch.Tensor:
    return torch.randn(1, tokens, width, dtype=torch.bfloat16)


def ids(tokens: int, shape: Shape) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.randint(shape.vocab, (1, tokens)),
        "attention_mask": torch.ones(1, tokens, dtype=torch.long),
        "loss_mask": torch.ones(1, tokens, dtype=torch.long),
    }


def eagle3(tokens: int, shape: Shape) -> Eagle3TargetBatch:
    return Eagle3TargetBatch(
        aux_hidden_states=states(tokens, 3 * shape.hidden), logits=states(tokens, shape.vocab), **ids(tokens, shape)
    )


def head_of(shape: Shape) -> TargetHead:
    """A head of the target's shape and dtype (its values do not change a byte of the sample: it is not stored)."""
    return TargetHead(torch.zeros(1, shape.hidden, dtype=torch.bfloat16).expand(shape.vocab, shape.hidden))


def eagle3_hidden(tokens: int, shape: Shape) -> FixedTarget:
    features = {
        "aux_hidden_states": states(tokens, 3 * shape.hidden),
        "last_hidden_states": states(tokens, shape.hidden),
    }
    return FixedTarget(HiddenSupervised({**features, **ids(tokens, shape)}, head_of(shape)))


def draft_vocab(tokens: int, shape: Shape) -> DraftVocabTarget:
    selected = torch.randperm(shape.vocab)[:DRAFT_VOCAB]
    mask = torch.zeros(shape.vocab, dtype=torch.bool)
    mask[selected] = True
    return DraftVocabTarget(FixedTarget(eagle3(tokens, shape)), DraftVocab(selected, mask))


def dflash(tokens: int, shape: Shape, *, logits: bool = False) -> DFlashTargetBatch:
    given = ids(tokens, shape)
    return DFlashTargetBatch(
        hidden_states=states(tokens, DRAFT_LAYERS * shape.hidden),
        input_ids=given["input_ids"],
        attention_mask=given["attention_mask"],
        loss_mask=given["loss_mask"],
        logits=states(tokens, shape.vocab) if logits else None,
    )


def dspark(tokens: int, shape: Shape) -> DSparkTargetBatch:
    given = ids(tokens, shape)
    return DSparkTargetBatch(
        target_hidden_states=states(tokens, DRAFT_LAYERS * shape.hidden),
        target_last_hidden_states=states(tokens, shape.hidden),
        input_ids=given["input_ids"],
        loss_mask=given["loss_mask"],
    )


def eagle12(tokens: int, shape: Shape) -> EagleTargetBatch:
    hidden = states(tokens, shape.hidden)
    return EagleTargetBatch(
        input_hidden_states=hidden,
        target_hidden_states=hidden.clone(),
        target_logits=states(tokens, shape.vocab),
        **ids(tokens, shape),
    )


@dataclasses.dataclass(frozen=True)
class Row:
    """One table row: its label, algorithm, the layers captured, the backend of one batch, the producer's options."""

    label: str
    algorithm: str
    layers: str
    build: Callable[[int, Shape], object]
    options: dict[str, Any] = dataclasses.field(default_factory=dict)


ROWS: tuple[Row, ...] = (
    Row("EAGLE-3, full-vocab logits", "eagle3", "3 aux layers", lambda t, s: FixedTarget(eagle3(t, s))),
    Row(f"EAGLE-3, {DRAFT_VOCAB // 1000}k draft vocab", "eagle3", "3 aux layers", draft_vocab),
    Row("EAGLE-3, last hidden state", "eagle3", "3 aux layers + final norm", eagle3_hidden),
    Row("EAGLE-3, last hidden state, fp8", "eagle3", "3 aux layers + final norm", eagle3_hidden, {"fp8": True}),
    Row("DFlash (DFlash 2, Domino)", "dflash", f"{DRAFT_LAYERS} layers", lambda t, s: FixedTarget(dflash(t, s))),
    Row(
        "JetSpec (DFlash + logits)",
        "dflash",
        f"{DRAFT_LAYERS} layers",
        lambda t, s: FixedTarget(dflash(t, s, logits=True)),
    ),
    Row("DSpark", "dspark", f"{DRAFT_LAYERS} layers + final norm", lambda t, s: FixedTarget(dspark(t, s))),
    Row("EAGLE-1/2", "eagle", "final norm", lambda t, s: FixedTarget(eagle12(t, s))),
)


def stored_bytes(row: Row, shape: Shape, store: FeatureStore, tokens: int, directory: str | None = None) -> int:
    """What one produced sample of ``row`` occupies: its ref's bytes, or the files under ``directory``."""
    producer = FeatureProducer(row.build(tokens, shape), store, run_id="bytes", algorithm=row.algorithm, **row.options)
    ones = torch.ones(1, tokens, dtype=torch.long)
    ref = producer.produce(input_ids=ones, attention_mask=ones, loss_mask=ones)
    if directory is None:
        return ref.estimated_bytes
    return sum(entry.stat().st_size for entry in os.scandir(directory) if entry.is_file(follow_symlinks=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="llama-3.1-8b")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per sample (256)")
    args = parser.parse_args()
    shape, tokens = SHAPES[args.model], args.tokens
    print(
        f"{args.model}: hidden {shape.hidden}, vocabulary {shape.vocab}, {shape.layers} layers; "
        f"one sample of {tokens} tokens, bf16 states/logits, int64 ids and masks"
    )
    print()
    print("| features | layers captured | bytes/token (tensors) | bytes/token (shared-dir files) | vs EAGLE-3 logits |")
    print("| --- | --- | ---: | ---: | ---: |")
    baseline = None
    for row in ROWS:
        local = stored_bytes(row, shape, LocalFeatureStore(), tokens)
        with tempfile.TemporaryDirectory() as directory:
            store = SharedDirFeatureStore(directory)
            on_disk = stored_bytes(row, shape, store, tokens, directory)
            store.close()
        baseline = baseline or local
        per_token = f"{local / tokens:,.0f} | {on_disk / tokens:,.0f}"
        print(f"| {row.label} | {row.layers} | {per_token} | {local / baseline:.2f}x |")


if __name__ == "__main__":
    main()
