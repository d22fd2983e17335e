"""Lockstep data-parallel loading of DFlash and DSpark samples: two gloo ranks over uneven local queues step
together, stop together at the shorter stream, and give back what they did not train, byte-checked per step."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from featurestream import FeatureAlgorithm, FeatureDataLoader, LocalFeatureStore, SampleRefQueue

from ._rank_worker import join_group
from .test_lockstep import assert_clean, launch


def rank_main(config: dict[str, Any], rank: int) -> None:
    """Train ``counts[rank]`` samples of ``config["algorithm"]`` in lockstep; log as ``_rank_worker`` does."""
    from support.algorithm_samples import sample_of

    join_group(config, rank)
    algorithm = FeatureAlgorithm(config["algorithm"])
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    for position in range(config["counts"][rank]):
        index = 100 * rank + position
        queue.put(store.put(f"s{index}", sample_of(algorithm, index), run_id="r", algorithm=algorithm))
    queue.close()
    with open(os.path.join(config["out"], f"rank{rank}.log"), "w") as log:
        steps = 0
        try:
            loader = FeatureDataLoader(
                queue, store, algorithm=algorithm, batch_size=2, prefetch=2, process_group=dist.group.WORLD
            )
            for batch in loader:
                ids = [lease.ref.sample_id for lease in loader.current_leases]
                # sample n's token ids start at 100 * n (data/algorithm_samples.py)
                assert batch.input_ids[:, 0].tolist() == [100 * int(i.removeprefix("s")) for i in ids], ids
                dist.all_reduce(torch.ones(2), group=dist.group.WORLD)
                steps += 1
                for identifier in ids:
                    print(f"trained {identifier}", file=log, flush=True)
            loader.close()
        except Exception as exc:
            print(f"error {exc!r}".replace("\n", " "), file=log, flush=True)
        drain = FeatureDataLoader(queue, store, algorithm=algorithm, prefetch=0)
        for _ in drain:
            print(f"leftover {drain.current_lease.ref.sample_id}", file=log, flush=True)  # type: ignore[union-attr]
        print(f"steps {steps}", file=log, flush=True)
    dist.destroy_process_group()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algorithm", [FeatureAlgorithm.DFLASH, FeatureAlgorithm.DSPARK])
def test_two_ranks_of_an_algorithm_step_and_stop_together(tmp_path: Path, algorithm: FeatureAlgorithm) -> None:
    counts = [5, 2]
    results = launch(tmp_path, 2, target=rank_main, algorithm=algorithm.value, counts=counts)
    assert_clean(results)
    assert [r["steps"] for r in results] == [1, 1], "both stop after the shorter stream's one batch of two"
    for rank, result in enumerate(results):
        ids = [f"s{100 * rank + position}" for position in range(counts[rank])]
        assert result["trained"] == ids[:2], "FIFO, in lockstep"
        assert Counter(result["trained"] + result["leftover"]) == Counter(ids), "given back, never lost or doubled"
