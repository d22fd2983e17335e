"""A checkpointing trainer and a resumable producer to kill and restart: exactly-once training, checked.

``train`` is a recipe's loop reduced to its bookkeeping: it records the prompt
keys of every step in a history (the stand-in for the model's weights),
saves ``{"loader": loader.state_dict(), "history": ...}`` atomically every
``every`` steps, and resumes from the latest checkpoint; ``produce`` runs a
``ResumableProducer`` over ``prompts(n)``. ``check_history`` says whether a
history trains every key once. Both run in-process or as processes
(``python -m featurestream.testing.resume trainer|producer ...``, which
``ResumeProcesses`` starts and restarts) to be SIGKILLed at any instant;
``docs/resume.md``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from featurestream.core.lease import VisibilityTimeout
from featurestream.core.protocol import LeaseQueue
from featurestream.core.resume import StaleTrainer, TrainingLedger, parse_sample_id
from featurestream.pipeline.eagle3 import Eagle3TargetBackend, Eagle3TargetBatch
from featurestream.pipeline.loader import FeatureDataLoader
from featurestream.pipeline.producer import FeatureProducer
from featurestream.pipeline.resume import ProducerReport, ResumableProducer
from featurestream.stores.base import FeatureStore
from featurestream.stores.orphans import DEFAULT_ORPHAN_GRACE

__all__ = [
    "KeyTarget",
    "ResumeProcesses",
    "check_history",
    "check_ledger",
    "latest_checkpoint",
    "produce",
    "prompts",
    "save_checkpoint",
    "train",
]

_HIDDEN = 4
_VOCAB = 8


class KeyTarget(Eagle3TargetBackend):
    """A deterministic target whose features are functions of the prompt's token ids (no model)."""

    def generate_batch(self, **inputs: torch.Tensor | None) -> Eagle3TargetBatch:
        input_ids = inputs["input_ids"]
        assert input_ids is not None
        hidden = input_ids.to(torch.float32).unsqueeze(-1).expand(*input_ids.shape, 3 * _HIDDEN).clone()
        logits = input_ids.to(torch.float32).unsqueeze(-1).expand(*input_ids.shape, _VOCAB).clone()
        return Eagle3TargetBatch(
            aux_hidden_states=hidden,
            input_ids=input_ids.clone(),
            attention_mask=inputs["attention_mask"].clone(),  # type: ignore[union-attr]
            loss_mask=inputs["loss_mask"].clone(),  # type: ignore[union-attr]
            logits=logits,
        )


def prompts(n: int, tokens: int = 3) -> list[torch.Tensor]:
    """``n`` distinct prompts of ``tokens`` tokens; prompt ``i``'s ids start at ``i * tokens``."""
    return [torch.arange(i * tokens, (i + 1) * tokens, dtype=torch.int64).reshape(1, tokens) for i in range(n)]


def latest_checkpoint(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The newest ``ckpt-<step>.json`` in ``directory`` (``None``: none yet)."""
    found = sorted(Path(directory).glob("ckpt-*.json"), key=lambda path: int(path.stem.split("-")[1]))
    return json.loads(found[-1].read_text()) if found else None


def save_checkpoint(directory: Path, checkpoint: dict[str, Any]) -> None:
    """Write ``checkpoint`` (its loader state names the step) as ``directory/ckpt-<step>.json``, atomically."""
    step = checkpoint["loader"]["step"]
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
    with os.fdopen(fd, "w") as out:
        json.dump(checkpoint, out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, directory / f"ckpt-{step}.json")  # a checkpoint is whole or absent, as a recipe's should be


def train(
    queue: LeaseQueue,
    store: FeatureStore,
    directory: str | os.PathLike[str],
    *,
    every: int = 3,
    batch_size: int = 2,
    prefetch: int = 2,
    crash: Callable[[str], None] | None = None,
    algorithm: str | None = None,
) -> list[list[str]]:
    """Train from the latest checkpoint in ``directory`` to the end of the epoch; return the history.

    ``algorithm``: the samples' algorithm (the loader's; default EAGLE-3, what ``produce`` stores).

    ``crash(point)`` is called at each point a crash may happen (``"step"``
    after a batch is trained, ``"saved"`` after a checkpoint was written); an
    exception it raises leaves the loader abandoned, as a killed trainer would.
    """
    directory = Path(directory)
    checkpoint = latest_checkpoint(directory)
    loader = FeatureDataLoader(queue, store, batch_size=batch_size, prefetch=prefetch, algorithm=algorithm)
    history: list[list[str]] = []
    if checkpoint is not None:
        loader.load_state_dict(checkpoint["loader"])
        history = checkpoint["history"]
    for _ in loader:
        history.append([_key(lease.ref.sample_id) for lease in loader.current_leases])
        if crash is not None:
            crash("step")
        if len(history) % every == 0:
            save_checkpoint(directory, {"loader": loader.state_dict(), "history": history})
            if crash is not None:
                crash("saved")
    save_checkpoint(directory, {"loader": loader.state_dict(), "history": history})
    loader.close()  # after the final checkpoint: ends the producer's run
    return history


def _key(sample_id: str) -> str:
    parsed = parse_sample_id(sample_id)
    if parsed is None:
        raise ValueError(f"sample {sample_id!r} is not a resumable producer's sample")
    return parsed[0]


def produce(
    queue: LeaseQueue, store: FeatureStore, n: int, *, run_id: str = "resume", stop: Callable[[], bool] | None = None
) -> ProducerReport:
    """Produce the ``n`` prompts of ``prompts(n)`` into ``queue`` until it is closed or ``stop()``."""
    producer = FeatureProducer(KeyTarget(), store, run_id=run_id)
    return ResumableProducer(producer, queue, prompts(n), chunk=4, poll_interval=0.05).run(stop)


def check_history(history: Sequence[Sequence[str]], n: int) -> str | None:
    """``None`` if ``history`` trains every key of ``0..n-1`` exactly once, else what is wrong."""
    counts = collections.Counter(key for step in history for key in step)
    twice = sorted((key for key, count in counts.items() if count > 1), key=int)
    missing = sorted((str(i) for i in range(n) if str(i) not in counts), key=int)
    unknown = sorted(key for key in counts if not key.isdigit() or int(key) >= n)
    if not (twice or missing or unknown):
        return None
    return f"trained twice: {twice}; never trained: {missing}; unknown: {unknown}"


def check_ledger(ledger: TrainingLedger) -> None:
    """Hold a fresh, empty ``ledger`` to the ``TrainingLedger`` contract (``AssertionError`` naming the step)."""
    assert ledger.declare(["a", "b", "c"]) == 3
    assert ledger.declare(["a", "d"]) == 1, "declaring again keeps the declared keys"
    assert ledger.claim({"a": 0, "b": 0, "c": 5}) == {"a": 1, "b": 1}, "c is not at generation 5"
    assert ledger.generations(["a", "c", "zz"]) == [1, 0, None]
    assert ledger.admit([("a", 1), ("a", 0), ("zz", 9)]) == [True, False, True], "stale generation; untracked key"
    first = ledger.restore(0, 0)
    assert first.incarnation == 1 and first.rolled_back == (), first
    assert ledger.commit(0, 1, 1, ["a", "zz"]) == 0, "an undeclared key is ignored"
    assert ledger.commit(0, 1, 2, ["b"]) == 0
    assert ledger.commit(0, 1, 2, ["b"]) == 0, "a retried commit of the same step is no duplicate"
    assert ledger.admit([("a", 1)]) == [False], "a trained key is not admitted"
    assert ledger.claim({"a": 1}) == {}, "a trained key is never produced again"
    assert ledger.history(0) == {1: ["a"], 2: ["b"]}, ledger.history(0)
    assert ledger.commit(0, 1, 3, ["a"]) == 1, "a trained key committed again is a duplicate"
    assert ledger.progress().duplicates == 1
    restored = ledger.restore(0, 1)
    assert restored.rolled_back == ("b",) and restored.incarnation == 2, restored
    assert ledger.history(0) == {1: ["a"]}, ledger.history(0)
    assert ledger.admit([("b", 1)]) == [True], "a rolled-back key's sample, still queued, may train again"
    try:
        ledger.commit(0, 1, 2, ["c"])
    except StaleTrainer as exc:
        assert "incarnation 1 may not commit step 2" in str(exc), exc
    else:
        raise AssertionError("a commit of a superseded incarnation was accepted")
    assert ledger.history(0) == {1: ["a"]}, "a refused commit records nothing"
    assert ledger.restore(1, 0).incarnation == 1, "each rank has its own incarnations"
    assert ledger.commit(1, 1, 1, ["c"]) == 0 and ledger.history(1) == {1: ["c"]}
    progress = ledger.progress()
    assert (progress.declared, progress.trained, progress.restores, progress.complete) == (4, 2, 3, False), progress
    try:
        ledger.restore(-1, 0)
    except ValueError as exc:
        assert "rank must be an int >= 0, got -1" in str(exc), exc
    else:
        raise AssertionError("restore(-1, 0) was accepted")


class ResumeProcesses:
    """A trainer and a producer process of this module's command line, both given ``common`` (the queue, the store
    directory, the prompts), each restartable after a SIGKILL.

    The trainer checkpoints into ``checkpoints`` every 2 steps, each step up to ``2 * step_seconds`` long; every
    incarnation's stderr is appended to ``<logs>/<role>.err``. A ``with`` block starts both and, on the way out,
    kills whichever still runs.
    """

    def __init__(self, common: Sequence[str], checkpoints: Path, logs: Path, *, step_seconds: float) -> None:
        self._arguments = {
            "trainer": [
                *common,
                "--checkpoints",
                str(checkpoints),
                "--every",
                "2",
                "--step-seconds",
                str(step_seconds),
            ],
            "producer": list(common),
        }
        self._errors = {role: logs / f"{role}.err" for role in self._arguments}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> ResumeProcesses:
        for role in self._arguments:
            self._procs[role] = self._spawn(role)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)

    def _spawn(self, role: str) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "featurestream.testing.resume", role, *self._arguments[role]]
        with self._errors[role].open("ab") as err:
            return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)

    def _stderr(self, role: str) -> str:
        return self._errors[role].read_text()[-3000:]

    def trained(self) -> bool:
        """Whether the trainer has ended its epoch (exit status 0); ``AssertionError`` with its stderr when either
        process exited otherwise."""
        for role, proc in self._procs.items():
            code = proc.poll()
            if code not in (None, 0):
                raise AssertionError(f"{role} exited with {code}: {self._stderr(role)}")
        return self._procs["trainer"].poll() == 0

    def restart(self, role: str) -> bool:
        """SIGKILL ``role``'s process if it still runs and start it again; whether it was killed."""
        proc = self._procs[role]
        killed = proc.poll() is None
        if killed:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        self._procs[role] = self._spawn(role)
        return killed

    def finish(self) -> None:
        """Wait for the producer, whose run the trainer's close after its final checkpoint ends; ``AssertionError``
        with its stderr unless it exits 0."""
        producer = self._procs["producer"]
        producer.wait(60)
        if producer.returncode != 0:
            raise AssertionError(self._stderr("producer"))


def _open(args: argparse.Namespace) -> tuple[LeaseQueue, FeatureStore]:
    from featurestream.backends.redis.queue import RedisSampleRefQueue  # needs redis-py: only for the processes
    from featurestream.stores.shared_dir import SharedDirFeatureStore

    store = SharedDirFeatureStore(args.store_dir, max_samples=None, max_bytes=1 << 30, orphan_grace=args.orphan_grace)
    # through Sentinel: "--sentinel HOST:PORT,HOST:PORT --service NAME" (a replicated Redis that fails over)
    target: dict[str, Any] = {"url": args.url}
    if args.sentinel:
        addresses = [address.rsplit(":", 1) for address in args.sentinel.split(",")]
        target = {"sentinels": [(host, int(port)) for host, port in addresses], "service_name": args.service}
    queue = RedisSampleRefQueue(store, VisibilityTimeout(args.visibility), name=args.name, **target)
    return queue, store


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("role", choices=("trainer", "producer"))
    parser.add_argument("--url", help="the Redis server (or --sentinel and --service)")
    parser.add_argument("--sentinel", default="", help="HOST:PORT,HOST:PORT...: the sentinels of a replicated Redis")
    parser.add_argument("--service", help="with --sentinel: the service the sentinels monitor")
    parser.add_argument("--name", required=True)
    parser.add_argument("--store-dir", required=True)
    parser.add_argument("--checkpoints", help="trainer: the checkpoint directory")
    parser.add_argument("--prompts", type=int, required=True)
    parser.add_argument("--visibility", type=float, default=1.0)
    parser.add_argument("--orphan-grace", type=float, default=DEFAULT_ORPHAN_GRACE, help="the store's orphan_grace")
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="trainer: sleep per step (a slower trainer)")
    parser.add_argument("--algorithm", help="trainer: the samples' algorithm (default: EAGLE-3, the producer's)")
    args = parser.parse_args(argv)
    queue, store = _open(args)
    try:
        if args.role == "producer":
            report = produce(queue, store, args.prompts)
            print(json.dumps(vars(report)), flush=True)
            return 0
        rng = random.Random()

        def slow(point: str) -> None:  # steps of random length, so a SIGKILL lands anywhere in one
            if args.step_seconds and point == "step":
                time.sleep(args.step_seconds * rng.random() * 2)

        history = train(
            queue,
            store,
            args.checkpoints,
            every=args.every,
            batch_size=args.batch_size,
            crash=slow,
            algorithm=args.algorithm,
        )
        print(json.dumps({"steps": len(history)}), flush=True)
        return 0
    finally:  # a clean exit: the run's last one, on a drained queue, leaves the store directory empty
        queue.disconnect()  # type: ignore[attr-defined]
        store.close()


if __name__ == "__main__":
    sys.exit(main())
