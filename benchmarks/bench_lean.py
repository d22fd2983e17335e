"""Samples/s through producer -> shared directory -> loader for each EAGLE-3 supervision encoding, in one run.

    python benchmarks/bench_lean.py [--tokens 512] [--samples 3] [--dir /dev/shm]

Samples are shaped like Llama-3.1-8B's EAGLE-3 output (hidden 4096, three
auxiliary layers, a 128,256-token vocabulary, bf16 states; int64 ids and
masks): full-vocabulary ``logits``, the target's ``last_hidden_states``
(``supervision="hidden"``) and the same with ``fp8=True``. For each, a
producer thread ``produce``s ``--samples`` samples (its backend returns a
prebuilt batch: the target's forward is not timed) into a
``SharedDirFeatureStore`` on ``--dir`` through an in-process
``SampleRefQueue``, and the loader (prefetch 2) yields every batch, the
logits rebuilt by a ``TargetHead`` on the CPU for the hidden-state
encodings. Samples/s is the samples over the time from the first
``produce`` to the last batch; one untimed sample first warms each path.
The head's fingerprint (a hash of its 1 GiB weight) is taken before timing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bytes_per_token import SHAPES, FixedTarget, eagle3, ids, states

from featurestream import FeatureDataLoader, FeatureProducer, SampleRefQueue, SharedDirFeatureStore
from featurestream.pipeline.supervision import HiddenSupervised
from featurestream.pipeline.target_head import TargetHead


def run(backend: Any, head: TargetHead | None, samples: int, directory: str, tokens: int, fp8: bool) -> float:
    """Samples/s of ``samples`` timed samples (after one untimed) through the shared directory and the loader."""
    with tempfile.TemporaryDirectory(dir=directory) as root:
        store = SharedDirFeatureStore(root, max_bytes=8 << 30)
        queue = SampleRefQueue(store)
        producer = FeatureProducer(backend, store, run_id="lean", algorithm="eagle3", fp8=fp8)
        ones = torch.ones(1, tokens, dtype=torch.long)
        started = threading.Event()

        def produce() -> None:
            try:
                for index in range(samples + 1):
                    if index == 1:
                        started.wait()
                    queue.put(producer.produce(input_ids=ones, attention_mask=ones, loss_mask=ones))
            finally:
                queue.close()  # a failed put ends the loader's stream too (the count check reports it)

        thread = threading.Thread(target=produce, daemon=True)
        thread.start()
        with FeatureDataLoader(queue, store, target_head=head, prefetch=2) as loader:
            iterator = iter(loader)
            next(iterator)
            begin = time.perf_counter()
            started.set()
            count = sum(1 for _ in iterator)
            elapsed = time.perf_counter() - begin
        thread.join()
        store.close()
    assert count == samples, count
    return samples / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir())
    args = parser.parse_args()
    shape, tokens = SHAPES["llama-3.1-8b"], args.tokens
    head = TargetHead(torch.randn(shape.vocab, shape.hidden, dtype=torch.bfloat16) * 0.02)
    print(f"fingerprint {head.fingerprint}; torch threads {torch.get_num_threads()}; load {os.getloadavg()[0]:.1f}")
    hidden = HiddenSupervised(
        {"aux_hidden_states": states(tokens, 3 * shape.hidden), "last_hidden_states": states(tokens, shape.hidden)}
        | ids(tokens, shape),
        head,
    )
    rows = [
        ("full-vocab logits", FixedTarget(eagle3(tokens, shape)), None, False, 281_112),
        ("last hidden state (head on CPU)", FixedTarget(hidden), head, False, 32_792),
        ("last hidden state, fp8 (head on CPU)", FixedTarget(hidden), head, True, 16_416),
    ]
    print(f"Llama-3.1-8B EAGLE-3, {tokens} tokens a sample, {args.samples} timed samples each, store on {args.dir}")
    print()
    print("| encoding | MiB/sample | samples/s | vs logits |")
    print("| --- | ---: | ---: | ---: |")
    baseline = None
    for label, backend, row_head, fp8, per_token in rows:
        rate = run(backend, row_head, args.samples, args.dir, tokens, fp8)
        baseline = baseline or rate
        print(f"| {label} | {per_token * tokens / 2**20:.1f} | {rate:.3f} | {rate / baseline:.2f}x |")


if __name__ == "__main__":
    main()
