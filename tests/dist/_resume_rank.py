"""One data-parallel rank of the lockstep resume test: ``run_resume_rank(config, rank)`` in a forked process.

It joins a gloo group, opens the shared Redis queue over a shared directory,
restores its loader from its own latest checkpoint (``config["checkpoints"]/rank<R>``)
if there is one, and trains in lockstep (an ``all_reduce`` per step), saving
``{"loader": state_dict(), "history": ...}`` every ``every`` steps. Its log
(the format ``test_lockstep.launch`` parses): ``restored STEP ROLLED_BACK``,
``trained KEY`` per prompt, ``error ...`` if the loop raised, ``steps N``
last. ``crash: {rank, at}`` makes that rank exit abruptly when its history
has ``at`` steps, holding its next batch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from featurestream import FeatureDataLoader, SharedDirFeatureStore, VisibilityTimeout
from featurestream.core.resume import parse_sample_id
from featurestream.testing.resume import latest_checkpoint, save_checkpoint

from ._rank_worker import join_group


def run_resume_rank(config: dict[str, Any], rank: int) -> None:
    from featurestream.backends.redis.queue import RedisSampleRefQueue

    join_group(config, rank)
    store = SharedDirFeatureStore(config["dir"], max_samples=None, max_bytes=1 << 30)
    queue = RedisSampleRefQueue(store, VisibilityTimeout(config["visibility"]), url=config["url"], name=config["name"])
    directory = Path(config["checkpoints"]) / f"rank{rank}"
    directory.mkdir(parents=True, exist_ok=True)
    crash = config.get("crash") or {}
    with open(os.path.join(config["out"], f"rank{rank}.log"), "w") as log:
        steps = -1
        try:
            loader = FeatureDataLoader(queue, store, prefetch=0, process_group=dist.group.WORLD)
            checkpoint = latest_checkpoint(directory)
            history: list[list[str]] = []
            if checkpoint is not None:
                loader.load_state_dict(checkpoint["loader"])
                history = checkpoint["history"]
                assert loader.last_restore is not None
                print(f"restored {loader.last_restore.step} {len(loader.last_restore.rolled_back)}", file=log, flush=True)
            for _ in loader:
                keys = [parse_sample_id(lease.ref.sample_id)[0] for lease in loader.current_leases]  # type: ignore[index]
                if crash.get("rank") == rank and len(history) == crash["at"]:
                    os._exit(3)
                dist.all_reduce(torch.ones(2), group=dist.group.WORLD)  # the step's gradient sync
                history.append(keys)
                if len(history) % config["every"] == 0:
                    save_checkpoint(directory, {"loader": loader.state_dict(), "history": history})
            save_checkpoint(directory, {"loader": loader.state_dict(), "history": history})
            steps = len(history)
            for key in (key for step in history for key in step):
                print(f"trained {key}", file=log, flush=True)
        except Exception as exc:
            print(f"error {exc!r}".replace("\n", " "), file=log, flush=True)
        print(f"steps {steps}", file=log, flush=True)
    queue.disconnect()
    if steps >= 0:
        dist.destroy_process_group()
