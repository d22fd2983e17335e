"""A producer process that ends the natural way (run as a script, not collected).

    python _close_worker.py URL NAME DIR COUNT

Puts samples ``s0..s{COUNT-1}`` into a shared-directory store and a Redis queue, then ``queue.close();
store.close()`` and exits.
"""

from __future__ import annotations

import sys

from featurestream import SharedDirFeatureStore
from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.testing import sample_tensors

TOKENS = 4


def main(argv: list[str]) -> None:
    url, name, directory, count = argv
    store = SharedDirFeatureStore(directory, create=True)
    queue = RedisSampleRefQueue(store, url=url, name=name)
    for index in range(int(count)):
        queue.put(store.put(f"s{index}", sample_tensors(index, TOKENS)))
    queue.close()
    store.close()


if __name__ == "__main__":
    main(sys.argv[1:])
