"""The lean EAGLE-3 encodings' bytes per token at the Llama-3.1-8B shape, from ``benchmarks/bytes_per_token.py``.

Arithmetic, not timing: each row's sample is produced into a ``LocalFeatureStore`` and its ref's
``estimated_bytes`` (the tensors' bytes) divided by the tokens.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from featurestream.pipeline.target_head import TargetHead
from featurestream.stores.local import LocalFeatureStore

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "bytes_per_token.py"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("bytes_per_token", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def per_token(bench: ModuleType, label: str, tokens: int = 4) -> float:
    (row,) = [row for row in bench.ROWS if row.label == label]
    return bench.stored_bytes(row, bench.SHAPES["llama-3.1-8b"], LocalFeatureStore(), tokens) / tokens


def test_the_lean_encodings_fit_their_budgets(bench: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    # The head is not stored: a head of 8 rows gives the bytes of one of 128,256 (and hashes in no time).
    monkeypatch.setattr(bench, "head_of", lambda shape: TargetHead(torch.zeros(8, shape.hidden, dtype=torch.bfloat16)))
    logits = per_token(bench, "EAGLE-3, full-vocab logits")
    lossless = per_token(bench, "EAGLE-3, last hidden state")
    fp8 = per_token(bench, "EAGLE-3, last hidden state, fp8")
    assert logits == 3 * 4096 * 2 + 128_256 * 2 + 3 * 8 == 281_112
    assert lossless == 3 * 4096 * 2 + 4096 * 2 + 3 * 8 == 32_792 <= 33_000
    assert fp8 == 3 * 4096 + 4 + 4096 + 4 + 3 * 8 == 16_416 <= 17_000
    assert logits / lossless > 8.5
