"""``featurestream demo --store mooncake --redis URL`` (or ``--sentinel HOST:PORT --service NAME``): the producer
and the trainer in separate processes.

The demo's own process starts a ``mooncake_master`` (127.0.0.1, free ports), hosts the samples in its
``MooncakeFeatureStore`` segment and runs the producer pipeline; a spawned trainer process (its own Mooncake
client without a segment, its own ``RedisSampleRefQueue`` instance on the same queue) runs the consumers,
fetching every tensor from the producer's segment through Mooncake's transfer engine. The trainer reaches the
queue as the demo was told to, the URL or the sentinels and service riding on its pickled arguments (no command
line) and any password in the environment it inherits. It reports what it trained, acked and lost back to the
demo process, whose summary checks the same promises as the in-process demo.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import queue as queue_module
import sys
import threading
import time
from collections import Counter
from typing import Any

import torch

from featurestream.pipeline.async_pipeline import AsyncFeaturePipeline
from featurestream.pipeline.producer import FeatureProducer
from featurestream.tools.demo import (
    BATCH_SIZE,
    SEQ_LEN,
    ProgressLines,
    Telemetry,
    Trainer,
    consume,
    make_queue,
    over_redis,
    redis_queue,
    store_caps,
    summary,
)
from featurestream.tools.models import TinyConfig, TinyEagle3Draft, prompt_batches
from featurestream.tools.mooncake import MooncakeMaster, missing_reason

__all__ = ["run_across_processes"]

# Room for the demo's caps (64 samples) and then some: the producer's segment holds every unconsumed sample.
_SEGMENT_BYTES = 256 * 1024 * 1024


def run_across_processes(
    args: argparse.Namespace, target: Any, target_description: str, config: TinyConfig, sample_bytes: int, run_id: str
) -> int:
    """Run the demo with the trainer in a child process; the exit status of ``demo.run``."""
    if not over_redis(args):
        print(
            "featurestream demo: --store mooncake runs the trainer in another process, whose queue must be shared: "
            "pass --redis redis://HOST:PORT/DB or --sentinel HOST:PORT --service NAME",
            file=sys.stderr,
        )
        return 2
    reason = missing_reason()
    if reason is not None:
        print(f"featurestream demo: --store mooncake: {reason}", file=sys.stderr)
        return 2
    from featurestream.stores.mooncake import MooncakeFeatureStore  # Mooncake is optional: import on use

    caps = store_caps(sample_bytes)
    with MooncakeMaster() as master:
        segment = max(_SEGMENT_BYTES, 2 * caps["max_bytes"])
        store = MooncakeFeatureStore(**master.store_kwargs(namespace=run_id, global_segment_size=segment), **caps)
        telemetry = Telemetry()
        queue = make_queue(store, args, telemetry)
        producer = FeatureProducer(
            target, store, run_id=run_id, target_model_version=f"{getattr(args, 'target', 'tiny')}-seed{args.seed}"
        )
        prompts = prompt_batches(
            args.samples, batch_size=BATCH_SIZE, seq_len=SEQ_LEN, vocab_size=config.vocab_size, seed=args.seed
        )
        context = mp.get_context("spawn")
        results = context.Queue()
        reader = master.store_kwargs(namespace=run_id, global_segment_size=0)
        trainer_process = context.Process(
            target=_train, args=(args, queue.name, reader, caps, config, results), name="featurestream-trainer"
        )
        started = time.perf_counter()
        pipeline = AsyncFeaturePipeline(producer, queue, prompts).start()
        trainer_process.start()
        report = _wait_for_report(trainer_process, results, queue, args)
        elapsed = time.perf_counter() - started
        errors: list[BaseException] = [RuntimeError(text) for text in report.get("errors", [])]
        try:
            pipeline.stop()
        except BaseException as exc:
            errors.append(exc)
        trainer, telemetry = _merge(report, telemetry, config, args)
        residual = store.health()
        store.close(force=True)  # only after a failed run can a sample still be queued here
        queue.disconnect()
        print(f"  (trainer: a separate process, pid {trainer_process.pid}; tensors via {store.store_uri})")
        return summary(args, store, queue, trainer, telemetry, elapsed, errors, residual, [], target_description)


def _wait_for_report(process: Any, results: Any, queue: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The trainer's report, showing progress meanwhile; a report of the failure if the trainer died without one."""
    progress = ProgressLines()
    while True:
        try:
            report: dict[str, Any] = results.get(timeout=0.2)
            break
        except queue_module.Empty:
            if not process.is_alive():
                report = {"errors": [f"the trainer process exited with {process.exitcode} before reporting"]}
                break
        if not args.no_progress:
            progress.show(_progress_line(queue, args))
    process.join(timeout=60)
    if not args.no_progress:
        progress.last(_progress_line(queue, args))
    return report


def _progress_line(queue: Any, args: argparse.Namespace) -> str:
    stats = queue.stats()
    return f"{stats.acked}/{args.samples} acked by the trainer process, redeliveries {stats.failed + stats.reclaimed}"


def _merge(
    report: dict[str, Any], telemetry: Telemetry, config: TinyConfig, args: argparse.Namespace
) -> tuple[Trainer, Telemetry]:
    """The demo process's view of what the trainer process did (its acks, leases and training steps)."""
    draft = TinyEagle3Draft(config, seed=args.seed + 1)
    trainer = Trainer(draft, torch.optim.AdamW(draft.parameters(), lr=3e-3))
    trainer.losses = list(report.get("losses", []))
    trainer.trained = Counter(report.get("trained", {}))
    trainer.sample_bytes = dict(report.get("sample_bytes", {}))
    for name in ("bytes_read", "deliveries", "failures", "crashes", "lost_leases"):
        setattr(trainer, name, int(report.get(name, 0)))
    telemetry.acks = Counter(report.get("acks", {}))
    telemetry.first_lease_at = dict(report.get("first_lease_at", {}))
    return trainer, telemetry


def _train(
    args: argparse.Namespace,
    queue_name: str,
    store_kwargs: dict[str, Any],
    caps: dict[str, Any],
    config: TinyConfig,
    results: Any,
) -> None:
    """The trainer process: ``args.consumers`` consumer threads over its own Mooncake client and queue instance."""
    from featurestream.stores.mooncake import MooncakeFeatureStore

    torch.set_num_threads(1)
    errors: list[BaseException] = []
    store = MooncakeFeatureStore(**store_kwargs, **caps)
    telemetry = Telemetry()
    queue = redis_queue(store, args, telemetry, queue_name)
    draft = TinyEagle3Draft(config, seed=args.seed + 1)
    trainer = Trainer(draft, torch.optim.AdamW(draft.parameters(), lr=3e-3))
    threads = [
        threading.Thread(target=consume, args=(i, queue, store, trainer, telemetry, args, errors))
        for i in range(args.consumers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put(
        {
            "losses": trainer.losses,
            "trained": dict(trainer.trained),
            "sample_bytes": trainer.sample_bytes,
            "bytes_read": trainer.bytes_read,
            "deliveries": trainer.deliveries,
            "failures": trainer.failures,
            "crashes": trainer.crashes,
            "lost_leases": trainer.lost_leases,
            "acks": dict(telemetry.acks),
            "first_lease_at": telemetry.first_lease_at,
            "errors": [f"{type(exc).__name__}: {exc}" for exc in errors],
        }
    )
    queue.disconnect()
    store.close(force=True)
