"""Exactly-once training across trainer and producer restarts, in-process (``docs/resume.md``)."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest

from featurestream import FeatureDataLoader, FeatureProducer, LocalFeatureStore, SampleRefQueue, VisibilityTimeout
from featurestream.core.resume import MemoryLedger, parse_sample_id, sample_id_for
from featurestream.pipeline import resume as resume_module
from featurestream.pipeline.resume import ResumableProducer
from featurestream.testing.resume import (
    KeyTarget,
    check_history,
    check_ledger,
    latest_checkpoint,
    produce,
    prompts,
    train,
)


class Crash(Exception):
    """A trainer or producer killed at this point."""


def test_sample_ids_carry_the_prompt_key_and_generation() -> None:
    sample_id = sample_id_for("run-1", "k-7", 3)
    assert sample_id == "run-1#prompt=k-7#g3"
    assert parse_sample_id(sample_id) == ("k-7", 3)
    for other in ("sample-run-1", "s3", "run#prompt=#g1", "run#prompt=a#gx", "run#g3", "x#prompt=a#g٣"):
        assert parse_sample_id(other) is None, other
    for bad in ("a/b", "", "a..b", "a#b", 3):
        with pytest.raises(ValueError, match="prompt key must be"):
            sample_id_for("run", bad, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="generation"):
        sample_id_for("run", "a", 0)


def test_the_memory_ledger_keeps_the_ledger_contract() -> None:
    check_ledger(MemoryLedger(lambda ids: set()))


def _queue(visibility: float = 0.3) -> tuple[SampleRefQueue, LocalFeatureStore]:
    store = LocalFeatureStore(max_samples=256)
    return SampleRefQueue(store, VisibilityTimeout(visibility), reaper_interval=0.05), store


def test_state_dict_round_trip_and_its_refusals() -> None:
    queue, store = _queue()
    producer = threading.Thread(target=produce, args=(queue, store, 6), daemon=True)
    producer.start()
    loader = FeatureDataLoader(queue, store, prefetch=0)
    next(loader)
    next(loader)
    state = loader.state_dict()
    assert state == {"version": 1, "step": 2, "rank": 0, "world_size": 1}
    assert json.loads(json.dumps(state)) == state
    assert queue.training_ledger().progress().trained == 2  # state_dict committed the batch the trainer held
    with pytest.raises(RuntimeError, match="before the first batch"):
        loader.load_state_dict(state)
    fresh = FeatureDataLoader(queue, store, prefetch=0)
    with pytest.raises(ValueError, match="rank 3 cannot restore rank 0"):
        fresh.load_state_dict({**state, "rank": 3})
    with pytest.raises(ValueError, match="state\\['step'\\] must be an int >= 0, got -1"):
        fresh.load_state_dict({**state, "step": -1})
    with pytest.raises(TypeError, match="mapping state_dict"):
        fresh.load_state_dict([2])  # type: ignore[arg-type]
    assert fresh.last_restore is None  # refused: nothing changed
    fresh.load_state_dict({**state, "step": 1})
    assert fresh.last_restore is not None and len(fresh.last_restore.rolled_back) == 1
    rest = [parse_sample_id(lease.ref.sample_id) for _ in fresh for lease in fresh.current_leases]
    assert len(rest) == 5  # the rolled-back prompt was produced again; 2 generations of it never both train
    fresh.close()
    producer.join(10)
    assert not producer.is_alive()


def test_a_restore_costs_the_prompts_of_the_steps_since_the_checkpoint(tmp_path: Path) -> None:
    """Checkpoint at step 3, train to step 5, crash: exactly steps 4 and 5's prompts are produced again."""
    queue, store = _queue()
    producer = ResumableProducer(FeatureProducer(KeyTarget(), store, run_id="r"), queue, prompts(12), chunk=4)
    thread = threading.Thread(target=producer.run, daemon=True)
    thread.start()

    loader = FeatureDataLoader(queue, store, batch_size=2, prefetch=0)
    for step, _ in enumerate(loader, start=1):
        if step == 3:
            checkpoint = loader.state_dict()
        if step == 5:
            break  # killed while training step 5: steps 4 and 5 are in no checkpoint
    loader.consume_now()  # step 5 committed and acked: the worst case, its samples are gone
    del loader
    restored = FeatureDataLoader(queue, store, batch_size=2, prefetch=0)
    restored.load_state_dict(checkpoint)
    assert restored.last_restore is not None
    assert len(restored.last_restore.rolled_back) == 4  # steps 4 and 5, two prompts each
    history = [[lease.ref.sample_id for lease in restored.current_leases] for _ in restored]
    restored.close()
    thread.join(10)
    assert producer.report.produced == 12 + 4  # each rolled-back prompt produced once more, nothing else
    assert producer.report.passes >= 2  # the first plan and the restore's (the fresh start's, if it came later)
    trained = [parse_sample_id(sid)[0] for step in history for sid in step]  # type: ignore[index]
    assert len(trained) == 12 - 6 and len(set(trained)) == 6


@pytest.mark.parametrize("seed", range(6))
def test_killed_and_restarted_at_random_points_every_prompt_trains_once(tmp_path: Path, seed: int) -> None:
    """Trainer crashes (mid-step, after a commit before its ack, after state_dict before the save, after a save)
    and producer crashes at seeded random points, each followed by a restart from the latest checkpoint."""
    n = 40
    rng = random.Random(seed)
    queue, store = _queue()
    restarts = {"trainer": 0, "producer": 0}
    stop_producer = threading.Event()

    def producer_life() -> None:
        while not queue.is_closed:
            stop_producer.clear()
            produce(queue, store, n, stop=stop_producer.is_set)
            restarts["producer"] += 1

    thread = threading.Thread(target=producer_life, daemon=True)
    thread.start()

    def crash(point: str) -> None:
        if rng.random() < 0.08:
            stop_producer.set()  # the producer dies too, or alone
        if rng.random() < (0.15 if point == "step" else 0.25) and restarts["trainer"] < 12:
            raise Crash(point)

    real_commit = resume_module.TrainerResume.commit

    def commit_then_maybe_die(self: resume_module.TrainerResume, leases: list) -> None:  # type: ignore[type-arg]
        real_commit(self, leases)
        if rng.random() < 0.05 and restarts["trainer"] < 12:
            raise Crash("committed, not acked")

    resume_module.TrainerResume.commit = commit_then_maybe_die  # type: ignore[method-assign]
    try:
        while True:
            try:
                history = train(
                    queue, store, tmp_path, every=rng.choice((1, 2, 3)), prefetch=rng.choice((0, 2)), crash=crash
                )
                break
            except Crash:
                restarts["trainer"] += 1
    finally:
        resume_module.TrainerResume.commit = real_commit  # type: ignore[method-assign]
    thread.join(10)
    assert not thread.is_alive()
    assert restarts["trainer"] >= 3, (restarts, check_history(history, n), len(history))
    assert check_history(history, n) is None, check_history(history, n)
    final = latest_checkpoint(tmp_path)
    assert final is not None and final["history"] == history and final["loader"]["step"] == len(history)


def test_check_history_names_what_is_wrong() -> None:
    assert check_history([["0", "1"], ["2"]], 3) is None
    assert check_history([["0", "1"], ["1"]], 3) == "trained twice: ['1']; never trained: ['2']; unknown: []"


def test_a_step_longer_than_the_visibility_timeout_never_trains_its_prompts_twice() -> None:
    """The held batch's leases expire mid-step and its samples come back through prefetch: they are checked
    again at hand-off, after the step committed them, and dropped."""
    queue, store = _queue(visibility=0.1)
    producer = threading.Thread(target=produce, args=(queue, store, 3), daemon=True)
    producer.start()
    loader = FeatureDataLoader(queue, store, prefetch=4, heartbeat_interval=0.02)
    trained = []
    for step, _ in enumerate(loader):
        trained += [parse_sample_id(lease.ref.sample_id)[0] for lease in loader.current_leases]  # type: ignore[index]
        if step < 2:
            time.sleep(0.4)  # reclaimed and redelivered meanwhile, into this loader's prefetch
    loader.close()
    producer.join(10)
    assert sorted(trained, key=int) == ["0", "1", "2"]
    assert queue.training_ledger().progress().duplicates == 0


@pytest.mark.parametrize("prefetch", [0, 2])
def test_the_last_short_batch_of_the_epoch_is_handed_out(tmp_path: Path, prefetch: int) -> None:
    """5 prompts in batches of 2: the epoch ends with a batch of one, which the stream must not wait on."""
    queue, store = _queue()
    producer = threading.Thread(target=produce, args=(queue, store, 5), daemon=True)
    producer.start()
    history = train(queue, store, tmp_path, batch_size=2, prefetch=prefetch)
    producer.join(10)
    assert [len(step) for step in history] == [2, 2, 1]
    assert check_history(history, 5) is None


def test_a_sample_whose_lease_expired_while_its_batch_filled_is_not_in_the_batch_twice() -> None:
    """prefetch=0 (no heartbeat) and a slow producer: the first sample of a batch of two expires while the
    puller waits for the second, and the puller leases it again; the batch must still hold it once."""
    from featurestream.pipeline.async_pipeline import prompt_kwargs

    queue, store = _queue(visibility=0.1)
    ledger = queue.training_ledger()
    ledger.declare(["0", "1"])
    ledger.claim({"0": 0, "1": 0})
    producer = FeatureProducer(KeyTarget(), store, run_id="r")
    two = prompts(2)

    def put(index: int) -> None:
        queue.put(producer.produce(**prompt_kwargs(two[index]), sample_id=sample_id_for("r", str(index), 1)))

    put(0)
    loader = FeatureDataLoader(queue, store, batch_size=2, prefetch=0)
    batches: list[list[str]] = []
    puller = threading.Thread(target=lambda: (next(loader), batches.append(_keys(loader))), daemon=True)
    puller.start()
    time.sleep(0.6)  # several expiries of sample 0's lease, each leased again by the waiting puller
    put(1)
    puller.join(10)
    assert batches == [["0", "1"]] or batches == [["1", "0"]], batches
    loader.close()


def _keys(loader: FeatureDataLoader) -> list[str]:
    return [parse_sample_id(lease.ref.sample_id)[0] for lease in loader.current_leases]  # type: ignore[index]
