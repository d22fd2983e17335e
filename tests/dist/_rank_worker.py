"""One data-parallel rank of the lockstep tests: ``run_rank(config, rank)`` in a forked process.

Forked, not spawned: the child reuses the test process's imported torch
(seconds per rank on a busy machine). It joins a gloo process group (a ``FileStore`` in the test's directory),
builds its queue — its own ``SampleRefQueue`` with ``counts[rank]`` samples
(``backend: local``), or a shared ``RedisSampleRefQueue`` the test filled
(``backend: redis``) — and trains with ``FeatureDataLoader(...,
process_group=WORLD)``: each step checks the batch's bytes and runs an
``all_reduce`` like DDP's gradient sync. It logs to ``OUT/rank{RANK}.log``:
``trained ID`` after each step, ``skipped`` for a bad sample it skipped,
``leftover ID`` for what its own queue still held afterwards (local),
``error ...`` if the loop raised, and ``steps N`` last. ``crash: {rank, after}``
makes that rank exit abruptly after that many steps, holding a batch and a
full prefetch buffer.
"""

from __future__ import annotations

import datetime
import os
from typing import Any, TextIO

import torch
import torch.distributed as dist

from featurestream import FeatureDataLoader, LocalFeatureStore, SampleRefQueue, SharedDirFeatureStore, VisibilityTimeout
from featurestream.testing import sample_tensors

TOKENS = 4
GROUP_TIMEOUT_S = 20  # the bound on a survivor's wait in a collective for a rank that never arrives


def eagle3_tensors(index: int) -> dict[str, torch.Tensor]:
    """A valid EAGLE-3 sample whose ``input_ids`` start at ``100 * index``."""
    tensors = sample_tensors(index, TOKENS)
    tensors["logits"] = torch.full((1, TOKENS, 8), float(index))
    return tensors


def sample_id(index: int) -> str:
    return f"s{index}"


def open_queue(config: dict[str, Any], rank: int) -> tuple[Any, Any]:
    if config["backend"] == "redis":
        from featurestream.backends.redis.queue import RedisSampleRefQueue

        store = SharedDirFeatureStore(config["dir"], max_samples=None, max_bytes=1 << 30)
        visibility = VisibilityTimeout(config.get("visibility", 30.0))
        return RedisSampleRefQueue(store, visibility, url=config["url"], name=config["name"]), store
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    bad_at = config.get("bad", {}).get(str(rank))
    for position in range(config["counts"][rank]):
        if position == bad_at:  # two encodings: the loader drops it and raises ValueError on this rank only
            tensors = eagle3_tensors(0)
            tensors["target_probs"] = tensors["logits"].softmax(-1)
            tensors["position_mask"] = tensors["loss_mask"].bool()
            queue.put(store.put(f"bad{rank}", tensors))
        queue.put(store.put(sample_id(1000 * rank + position), eagle3_tensors(1000 * rank + position)))
    queue.close()
    return queue, store


def train(config: dict[str, Any], rank: int, queue: Any, store: Any, log: TextIO) -> int:
    crash = config.get("crash") or {}
    steps = 0
    loader = FeatureDataLoader(
        queue,
        store,
        prefetch=config["prefetch"],
        batch_size=config["batch_size"],
        process_group=dist.group.WORLD,
    )
    with loader:
        while True:
            try:
                batch = next(loader)
            except StopIteration:
                return steps
            except ValueError:
                print("skipped", file=log, flush=True)
                continue
            ids = [lease.ref.sample_id for lease in loader.current_leases]
            first_ids = [int(v) for v in batch.input_ids[:, 0].tolist()]
            if first_ids != [100 * int(i.removeprefix("s")) for i in ids]:
                raise AssertionError(f"batch bytes {first_ids} do not match its leases {ids}")
            if crash.get("rank") == rank and steps == crash["after"]:
                os._exit(3)  # mid-step: the batch, the prefetch buffer and the store handles are left behind
            dist.all_reduce(torch.ones(2), group=dist.group.WORLD)  # the step's gradient sync
            steps += 1
            for identifier in ids:
                print(f"trained {identifier}", file=log, flush=True)


def join_group(config: dict[str, Any], rank: int) -> None:
    """Join the launch's gloo group as ``rank`` (one CPU thread: the ranks share the machine)."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=config["init"],
        rank=rank,
        world_size=config["world"],
        timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S),
    )


def run_rank(config: dict[str, Any], rank: int) -> None:
    join_group(config, rank)
    queue, store = open_queue(config, rank)
    with open(os.path.join(config["out"], f"rank{rank}.log"), "w") as log:
        steps = -1
        try:
            steps = train(config, rank, queue, store, log)
        except Exception as exc:
            print(f"error {exc!r}".replace("\n", " "), file=log, flush=True)
        if config["backend"] == "local":  # what the lockstep stop gave back is still in this rank's queue
            drain = FeatureDataLoader(queue, store, prefetch=0)
            for _ in drain:
                print(f"leftover {drain.current_lease.ref.sample_id}", file=log, flush=True)  # type: ignore[union-attr]
        print(f"steps {steps}", file=log, flush=True)
    if steps >= 0:
        dist.destroy_process_group()
