"""A producer or consumer process streaming a user-registered algorithm over Redis (run as a script, not collected).

    python _algorithm_worker.py consume-bare URL NAME DIR     never registers acme.msd: an EAGLE-3 loader meets one
    python _algorithm_worker.py consume URL NAME DIR COUNT    registers it and trains COUNT batches

Each consumer prints one JSON line: the error it met, or what each batch held.
"""

from __future__ import annotations

import json
import sys

import torch

from featurestream import FeatureDataLoader, SharedDirFeatureStore
from featurestream.backends.redis.queue import RedisSampleRefQueue


def main(mode: str, url: str, name: str, directory: str, *rest: str) -> None:
    torch.set_num_threads(1)
    store = SharedDirFeatureStore(directory)
    queue = RedisSampleRefQueue(store, url=url, name=name)
    if mode == "consume-bare":
        # Left unclosed on purpose: the queue is shared, and this consumer only meets one sample.
        loader = FeatureDataLoader(queue, store, prefetch=0)
        try:
            next(loader)
        except ValueError as exc:
            print(json.dumps({"error": str(exc)}), flush=True)
    else:
        import _acme_algorithm

        loader = FeatureDataLoader(queue, store, algorithm=_acme_algorithm.NAME, prefetch=0)
        seen = []
        for _ in range(int(rest[0])):
            batch = next(loader)
            assert isinstance(batch, _acme_algorithm.AcmeBatch), type(batch)
            seen.append({name: batch[name].tolist() for name in batch.keys()})
        loader.consume_now()
        print(json.dumps({"batches": seen}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
