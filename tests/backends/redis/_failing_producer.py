"""A producer process whose target fails on its third forward (run as a script, not collected).

    python _failing_producer.py URL NAME DIR

A ``ResumableProducer`` over the Redis queue ``NAME`` and a shared directory, fed the README's dict prompts.
"""

from __future__ import annotations

import sys

import torch

from featurestream import FeatureProducer, SharedDirFeatureStore, VisibilityTimeout
from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.pipeline.resume import ResumableProducer
from featurestream.testing.resume import KeyTarget


class BrokenTarget(KeyTarget):
    """Raises on its third forward."""

    calls = 0

    def generate_batch(self, **inputs: torch.Tensor | None):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("CUDA out of memory on forward 3")
        return super().generate_batch(**inputs)


def main(url: str, name: str, directory: str) -> None:
    store = SharedDirFeatureStore(directory)
    queue = RedisSampleRefQueue(store, VisibilityTimeout(30.0), url=url, name=name)
    ids = [torch.arange(3 * i, 3 * i + 3).reshape(1, 3) for i in range(6)]
    prompts = [{"input_ids": t, "attention_mask": torch.ones_like(t), "loss_mask": torch.ones_like(t)} for t in ids]
    ResumableProducer(FeatureProducer(BrokenTarget(), store, run_id="remote"), queue, prompts).run()


if __name__ == "__main__":
    main(*sys.argv[1:4])
