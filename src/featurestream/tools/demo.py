"""``featurestream demo``: train a tiny draft head on features streamed from a tiny target model.

``--algorithm eagle3`` (default), ``dflash`` or ``dspark`` picks the features
streamed and the draft head trained on them (``TinyEagle3Draft``,
``TinyDFlashDraft``, ``TinyDSparkDraft``). ``--target tiny`` (default) is
featurestream's own small transformer; ``--target hf-llama`` / ``hf-qwen2`` /
``hf-qwen3`` / ``hf-mistral`` is a randomly initialised Hugging Face model of
that architecture, the same size, driven through ``HFEagle3TargetModel``,
``HFDFlashTargetModel`` or ``HFDSparkTargetModel`` (needs ``featurestream[hf]``).

prompts -> ``AsyncFeaturePipeline`` (target forward on a background thread)
-> feature store -> ``SampleRefQueue`` -> one ``FeatureDataLoader`` per
consumer thread -> draft training steps. Consumers fail some steps
(``--fail-rate``: the lease is failed and redelivered) and crash now and then
(``--crash-every``: the consumer abandons its lease mid-step and restarts;
the short visibility timeout reclaims the lease and another consumer gets
it). The closing summary checks what the run promises: every sample acked
exactly once, none lost, the store empty, and the draft's loss falling; the
exit status is 1 if any check fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from typing import Any

import torch

from featurestream.backends.memory.queue import LeaseLost, SampleRefQueue
from featurestream.core import events
from featurestream.core.lease import VisibilityTimeout
from featurestream.monitor.metrics import Metrics, MetricsLogger
from featurestream.ops.target import TargetError, add_server_arguments, connection_keywords, describe_target
from featurestream.pipeline.async_pipeline import AsyncFeaturePipeline
from featurestream.pipeline.loader import FeatureDataLoader
from featurestream.pipeline.producer import FeatureProducer
from featurestream.stores.base import FeatureStore
from featurestream.stores.local import LocalFeatureStore
from featurestream.stores.shared_dir import DATA_SUFFIX, RETAINED_SUFFIX, SharedDirFeatureStore
from featurestream.tools.diagrams import render_queue
from featurestream.tools.models import (
    HF_FAMILIES,
    TinyConfig,
    TinyDFlashDraft,
    TinyDFlashTarget,
    TinyDSparkDraft,
    TinyDSparkTarget,
    TinyEagle3Draft,
    TinyTargetModel,
    prompt_batches,
    tiny_hf_causal_lm,
)

BATCH_SIZE = 4
SEQ_LEN = 32
MAX_DELIVERIES = 10
TARGETS = ("tiny", *(f"hf-{family}" for family in HF_FAMILIES))
ALGORITHMS = ("eagle3", "dflash", "dspark")
DraftHead = TinyEagle3Draft | TinyDFlashDraft | TinyDSparkDraft


def make_target(args: argparse.Namespace, config: TinyConfig) -> tuple[Any, str]:
    """The demo's target backend and a description of it (the one place a target is chosen).

    DFlash and DSpark capture three layers, as EAGLE-3 does: the tiny target's
    tapped layers, or, on a Hugging Face model of ``n`` layers, ``(1, n//2 - 1,
    n - 3)`` (the reference's ``build_target_layer_ids`` for three draft layers).
    """
    target_name = getattr(args, "target", "tiny")
    algorithm = getattr(args, "algorithm", "eagle3")
    if target_name == "tiny":
        tiny_class = {"eagle3": TinyTargetModel, "dflash": TinyDFlashTarget, "dspark": TinyDSparkTarget}[algorithm]
        tiny = tiny_class(config, seed=args.seed)
        return tiny, f"{tiny_class.__name__}, {config.num_layers} layers, aux layers {config.aux_layers}"
    from featurestream.pipeline import hf  # transformers is optional: import on use

    model = tiny_hf_causal_lm(target_name.removeprefix("hf-"), config, seed=args.seed)
    if algorithm == "eagle3":
        hf_target: Any = hf.HFEagle3TargetModel(model)
        layers = hf_target.aux_layer_ids
    else:
        count = len(hf.find_decoder_layers(model))
        layers = (1, count // 2 - 1, count - 3)
        wrapper = hf.HFDFlashTargetModel if algorithm == "dflash" else hf.HFDSparkTargetModel
        hf_target = wrapper(model, layers)
    return hf_target, (
        f"{type(model).__name__} (random init, transformers), {hf_target.num_layers} layers, "
        f"aux layers {tuple(layers)}, through {type(hf_target).__name__}"
    )


def make_draft(args: argparse.Namespace, config: TinyConfig, target: Any) -> DraftHead:
    """The draft head trained on ``args.algorithm``'s features (the DSpark one copies the target's LM head)."""
    seed = args.seed + 1
    algorithm = getattr(args, "algorithm", "eagle3")
    if algorithm == "dflash":
        return TinyDFlashDraft(config, seed=seed)
    if algorithm == "dspark":
        return TinyDSparkDraft(config, target_lm_head=target.get_output_embeddings(), seed=seed)
    return TinyEagle3Draft(config, seed=seed)


def token_bytes(algorithm: str, config: TinyConfig) -> int:
    """Bytes one token of a sample takes in the store: float32 states, int64 ids and masks."""
    hidden = config.hidden_size
    return {
        "eagle3": 3 * hidden * 4 + config.vocab_size * 4 + 3 * 8,  # aux states, logits, ids and two masks
        "dflash": 3 * hidden * 4 + 3 * 8,  # context states, ids and two masks
        "dspark": 4 * hidden * 4 + 2 * 8,  # context and last states, ids and the loss mask
    }[algorithm]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--algorithm",
        choices=ALGORITHMS,
        default="eagle3",
        help="the features streamed and the draft head trained on them (eagle3)",
    )
    parser.add_argument(
        "--target",
        choices=TARGETS,
        default="tiny",
        help="target model: featurestream's tiny transformer, or a random-init Hugging Face architecture of the "
        "same size (hf-*: needs featurestream[hf]) (tiny)",
    )
    parser.add_argument(
        "--store",
        choices=("local", "shared-dir", "mooncake"),
        default="local",
        help="feature store (local); mooncake: a mooncake_master of its own, the trainer in a separate process "
        "(needs --redis or --sentinel, and featurestream[mooncake])",
    )
    parser.add_argument("--dir", metavar="PATH", help="shared-dir store directory (default: a fresh temporary one)")
    parser.add_argument("--samples", type=_positive_int, default=300, metavar="N", help="samples to stream (300)")
    parser.add_argument("--consumers", type=_positive_int, default=2, metavar="K", help="consumer threads (2)")
    parser.add_argument(
        "--fail-rate", type=_probability, default=0.05, metavar="P", help="chance a step fails its lease (0.05)"
    )
    parser.add_argument(
        "--crash-every",
        type=_non_negative_int,
        default=100,
        metavar="N",
        help="every N-th delivery the consumer crashes mid-step, abandoning its lease (100; 0 = never)",
    )
    parser.add_argument(
        "--visibility-timeout", type=float, default=1.0, metavar="S", help="lease visibility timeout in s (1.0)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for models, prompts and fault injection (0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (nor metrics) on stderr")
    parser.add_argument(
        "--metrics-every",
        type=_non_negative_int,
        default=100,
        metavar="N",
        help="print the queue metrics (featurestream.monitor.metrics) every N training steps on stderr (100; 0 = off)",
    )
    parser.add_argument(
        "--render", metavar="PATH", help="draw the queue's final state snapshot to PATH (.svg/.png need graphviz)"
    )
    add_server_arguments(
        parser,
        redis_help="run the queue on this Redis server (RedisSampleRefQueue, a fresh queue name per run; needs "
        "redis-py); or on a replicated Redis through --sentinel (passwords from $FEATURESTREAM_REDIS_PASSWORD and "
        "$FEATURESTREAM_SENTINEL_PASSWORD)",
    )


def over_redis(args: argparse.Namespace) -> bool:
    """Whether the queue lives on Redis (``--redis`` or ``--sentinel``) rather than in this process."""
    return bool(getattr(args, "redis", None) or getattr(args, "sentinel", None))


def make_queue(store: FeatureStore, args: argparse.Namespace, tracer: Any) -> SampleRefQueue:
    """The demo's queue (the one place a queue backend is chosen)."""
    if over_redis(args):
        return redis_queue(store, args, tracer, f"demo-{uuid.uuid4().hex[:12]}")
    return SampleRefQueue(
        store,
        VisibilityTimeout(args.visibility_timeout),
        max_deliveries=MAX_DELIVERIES,
        tracer=tracer,
    )


def redis_queue(store: FeatureStore, args: argparse.Namespace, tracer: Any, name: str) -> SampleRefQueue:
    """An instance of the Redis queue ``name`` at ``--redis`` or through ``--sentinel`` (checked by ``run``)."""
    from featurestream.backends.redis.queue import RedisSampleRefQueue  # redis-py is optional: import on use

    return RedisSampleRefQueue(
        store,
        VisibilityTimeout(args.visibility_timeout),
        max_deliveries=MAX_DELIVERIES,
        tracer=tracer,
        name=name,
        **connection_keywords(args),
    )


def store_caps(sample_bytes: int) -> dict[str, Any]:
    """Caps whose watermarks make backpressure visible: pause at 12 samples, resume at 4."""
    return {
        "max_samples": None,
        "max_bytes": 64 * sample_bytes,
        "high_watermark_bytes": 12 * sample_bytes,
        "low_watermark_bytes": 4 * sample_bytes,
    }


def make_store(args: argparse.Namespace, directory: str | None, sample_bytes: int) -> FeatureStore:
    """A store with ``store_caps``."""
    caps = store_caps(sample_bytes)
    if args.store == "shared-dir":
        assert directory is not None
        return SharedDirFeatureStore(directory, **caps)
    return LocalFeatureStore(**caps)


class Telemetry:
    """The queue's tracer: when each sample was put and first leased, and how often it was acked."""

    def __init__(self) -> None:
        self.put_at: dict[str, float] = {}
        self.first_lease_at: dict[str, float] = {}
        self.acks: Counter[str] = Counter()

    def __call__(self, action: str, fields: dict[str, object]) -> None:
        # Runs under the queue's lock: record and return.
        sample_id = fields.get("sample_id")
        if action == events.PUT:
            self.put_at[sample_id] = time.perf_counter()  # type: ignore[index]
        elif action == events.ACQUIRE:
            self.first_lease_at.setdefault(sample_id, time.perf_counter())  # type: ignore[arg-type]
        elif action == events.ACK:
            self.acks[sample_id] += 1  # type: ignore[index]


@dataclasses.dataclass
class Trainer:
    """The draft head, its optimizer, and what the consumers did."""

    draft: DraftHead
    optimizer: torch.optim.Optimizer
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    losses: list[float] = dataclasses.field(default_factory=list)
    trained: Counter[str] = dataclasses.field(default_factory=Counter)
    bytes_read: int = 0
    sample_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    deliveries: int = 0
    failures: int = 0
    crashes: int = 0
    lost_leases: int = 0
    wakeups: list[float] = dataclasses.field(default_factory=list)
    metrics: MetricsLogger | None = None  # a tracker would log these; the demo prints them

    def step(self, batch: Any) -> float:
        loss = self.draft.loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())


def consume(
    worker: int,
    queue: SampleRefQueue,
    store: FeatureStore,
    trainer: Trainer,
    telemetry: Telemetry,
    args: argparse.Namespace,
    errors: list[BaseException],
) -> None:
    """Consumer thread ``worker``: train on ``queue``'s samples through a ``FeatureDataLoader`` until it is drained,
    failing (``args.fail_rate``) and crashing (``args.crash_every``) as asked and counting it all in ``trainer``;
    an error is appended to ``errors`` and closes the queue (so the other consumers and the producer stop)."""
    rng = random.Random(args.seed * 1000 + worker)
    try:
        while True:
            # A simulated crash abandons the loader mid-lease. Without prefetch its one lease is left to expire
            # as a killed process's would; a prefetch buffer would be failed back when the loader is collected.
            loader = FeatureDataLoader(queue, store, algorithm=getattr(args, "algorithm", "eagle3"), prefetch=0)
            crashed = False
            waiting_since = time.perf_counter()
            for batch in loader:
                lease = loader.current_lease
                assert lease is not None
                sample_id = lease.ref.sample_id
                with trainer.lock:
                    trainer.deliveries += 1
                    trainer.bytes_read += lease.ref.estimated_bytes
                    trainer.sample_bytes[sample_id] = lease.ref.estimated_bytes
                    put_at = telemetry.put_at.get(sample_id, 0.0)
                    if lease.redelivery_count == 0 and put_at > waiting_since:
                        trainer.wakeups.append(telemetry.first_lease_at[sample_id] - put_at)
                    crashed = args.crash_every > 0 and trainer.deliveries % args.crash_every == 0
                    if crashed:
                        trainer.crashes += 1
                        break  # abandon the lease and the store handle mid-step, like a killed process
                    if rng.random() < args.fail_rate:
                        trainer.failures += 1
                        loader.fail_current()
                    else:
                        try:
                            queue.extend(lease)  # heartbeat: the step is about to start
                        except LeaseLost:
                            trainer.lost_leases += 1  # reclaimed while we waited for the lock: someone else has it
                        else:
                            trainer.losses.append(trainer.step(batch))
                            trainer.trained[sample_id] += 1
                            if trainer.metrics is not None:
                                trainer.metrics.step()
                waiting_since = time.perf_counter()
            if not crashed:
                loader.close()
                return
    except BaseException as exc:
        errors.append(exc)
        queue.close()


class ProgressLines:
    """A progress line on stderr: redrawn in place on a terminal; elsewhere (a log, a pipe) written as a line of
    its own only when it changed and at most every ``interval`` seconds, so a log gets a few lines, not one per
    redraw. ``last`` writes the final line (unless a log has it already)."""

    def __init__(self, interval: float = 5.0) -> None:
        self.live = sys.stderr.isatty()
        self._interval = interval
        self._written = ""
        self._due = 0.0

    def show(self, line: str) -> None:
        if self.live:
            sys.stderr.write("\r" + line)
        elif line != self._written and time.monotonic() >= self._due:
            sys.stderr.write(line + "\n")
            self._due = time.monotonic() + self._interval
        else:
            return
        self._written = line
        sys.stderr.flush()

    def last(self, line: str) -> None:
        if self.live:
            sys.stderr.write("\r" + line + "\n")
        elif line != self._written:
            sys.stderr.write(line + "\n")
        self._written = line
        sys.stderr.flush()


def _progress(done: int, total: int, trainer: Trainer, queue: SampleRefQueue) -> str:
    width = 30
    filled = width * done // max(total, 1)
    stats = queue.stats()
    loss = f"{trainer.losses[-1]:.3f}" if trainer.losses else "-"
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} acked  loss {loss}  "
        f"redeliveries {stats.failed + stats.reclaimed}  pauses {stats.producer_pauses}  "
    )


def _print_metrics(queue_name: str, metrics: Metrics) -> None:
    # On a terminal, clear the progress bar's line first; the next redraw brings it back.
    clear = "\r\x1b[K" if sys.stderr.isatty() else ""
    sys.stderr.write(f"{clear}metrics of queue {queue_name}: {json.dumps(metrics)}\n")
    sys.stderr.flush()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(values: list[float]) -> str:
    if not values:
        return "n/a (no sample arrived while a consumer waited)"
    return (
        f"median {statistics.median(values) * 1e3:.2f} ms, p99 {_percentile(values, 0.99) * 1e3:.2f} ms "
        f"({len(values)} samples)"
    )


def run(args: argparse.Namespace) -> int:
    if args.visibility_timeout <= 0:
        print("featurestream demo: --visibility-timeout must be > 0", file=sys.stderr)
        return 2
    try:
        connection_keywords(args)  # --sentinel and --service go together (the operator commands' rule)
    except TargetError as exc:
        print(f"featurestream demo: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # one core for the producer thread, one for training
    config = TinyConfig()
    try:
        target, target_description = make_target(args, config)
    except ImportError as exc:  # an hf-* target without the optional transformers
        print(f"featurestream demo: {exc}", file=sys.stderr)
        return 2
    algorithm = getattr(args, "algorithm", "eagle3")
    sample_bytes = BATCH_SIZE * SEQ_LEN * token_bytes(algorithm, config)
    temp_dir = tempfile.mkdtemp(prefix="featurestream-demo-") if args.store == "shared-dir" and not args.dir else None
    directory = args.dir or temp_dir
    run_id = f"demo{args.seed}-{uuid.uuid4().hex[:8]}"
    if args.store == "mooncake":
        if algorithm != "eagle3":
            print(
                f"featurestream demo: --store mooncake runs --algorithm eagle3 only, got {algorithm}", file=sys.stderr
            )
            return 2
        from featurestream.tools.demo_mooncake import run_across_processes  # Mooncake is optional: import on use

        return run_across_processes(args, target, target_description, config, sample_bytes, run_id)
    try:
        store = make_store(args, directory, sample_bytes)
        telemetry = Telemetry()
        queue = make_queue(store, args, telemetry)
        draft = make_draft(args, config, target)
        trainer = Trainer(draft, torch.optim.AdamW(draft.parameters(), lr=3e-3))
        if args.metrics_every and not args.no_progress:
            # The Redis queue's name is what `featurestream status --name` needs: print it with the metrics.
            label = getattr(queue, "name", "in-process")
            sink = functools.partial(_print_metrics, label)
            trainer.metrics = MetricsLogger(queue, every=args.metrics_every, sink=sink)
        producer = FeatureProducer(
            target, store, run_id=run_id, target_model_version=f"{getattr(args, 'target', 'tiny')}-seed{args.seed}"
        )
        prompts = prompt_batches(
            args.samples, batch_size=BATCH_SIZE, seq_len=SEQ_LEN, vocab_size=config.vocab_size, seed=args.seed
        )
        errors: list[BaseException] = []
        consumers = [
            threading.Thread(
                target=consume, args=(i, queue, store, trainer, telemetry, args, errors), name=f"consumer-{i}"
            )
            for i in range(args.consumers)
        ]
        started = time.perf_counter()
        pipeline = AsyncFeaturePipeline(producer, queue, prompts).start()
        for thread in consumers:
            thread.start()
        progress = ProgressLines()
        while alive := [thread for thread in consumers if thread.is_alive()]:
            if not args.no_progress:
                progress.show(_progress(queue.stats().acked, args.samples, trainer, queue))
            alive[0].join(0.2)
        for thread in consumers:
            thread.join()
        elapsed = time.perf_counter() - started
        try:
            pipeline.stop()
        except BaseException as exc:
            errors.append(exc)
        if not args.no_progress:
            progress.last(_progress(queue.stats().acked, args.samples, trainer, queue))
        leftovers = _leftover_files(directory, run_id) if directory else []
        residual = store.health()
        if args.render:
            render_queue(queue, args.render)
        store.close()
        return summary(args, store, queue, trainer, telemetry, elapsed, errors, residual, leftovers, target_description)
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


def _leftover_files(directory: str, run_id: str) -> list[str]:
    prefixes = (f"sample-{run_id}-", f".sample-{run_id}-")
    suffixes = (DATA_SUFFIX, RETAINED_SUFFIX, ".tmp")
    return sorted(name for name in os.listdir(directory) if name.startswith(prefixes) and name.endswith(suffixes))


def _queue_description(queue: object, args: argparse.Namespace) -> str:
    """In-process, or the Redis queue's name and where it lives, password hidden (what ``featurestream status``
    needs)."""
    if not over_redis(args):
        return "in-process"
    name = getattr(queue, "name", "?")
    return f"RedisSampleRefQueue {name!r} at {describe_target(args)} (featurestream status --name)"


def summary(
    args: argparse.Namespace,
    store: FeatureStore,
    queue: SampleRefQueue,
    trainer: Trainer,
    telemetry: Telemetry,
    elapsed: float,
    errors: list[BaseException],
    residual: Any,
    leftovers: list[str],
    target_description: str = "",
) -> int:
    """Print what the run did and the promises it checks (exactly-once, nothing lost or left resident, learning);
    return the demo's exit status: 0 when every check holds."""
    stats = queue.stats()
    put_ids = set(telemetry.put_at)
    latencies = [telemetry.first_lease_at[s] - telemetry.put_at[s] for s in put_ids if s in telemetry.first_lease_at]
    acked_twice = sorted(s for s, n in telemetry.acks.items() if n > 1)
    never_acked = sorted(put_ids - set(telemetry.acks) - {d.ref.sample_id for d in queue.dead_letters()})
    untrained = sorted(put_ids - set(trainer.trained) - {d.ref.sample_id for d in queue.dead_letters()})
    steps = len(trainer.losses)
    head = trainer.losses[: min(10, steps)]
    tail = trainer.losses[-min(10, steps) :]
    first_loss = statistics.fmean(head) if head else float("nan")
    last_loss = statistics.fmean(tail) if tail else float("nan")
    checks = {
        "every sample put was acked exactly once": not acked_twice and not never_acked and stats.acked == len(put_ids),
        f"all {args.samples} samples were streamed": len(put_ids) == args.samples,
        "every acked sample was trained on": not untrained,
        "nothing pending, leased or resident at the end": stats.pending == 0
        and stats.outstanding == 0
        and residual.sample_count == 0
        and residual.resident_bytes == 0
        and not leftovers,
        "the draft's loss fell": steps >= 2 and last_loss < first_loss,
        "no consumer or producer error": not errors,
    }
    lines = [
        f"featurestream demo: {args.samples} samples -> {store.store_uri}, queue "
        f"{_queue_description(queue, args)}, "
        f"{args.consumers} consumers, "
        f"fail-rate {args.fail_rate}, crash-every {args.crash_every}, visibility {args.visibility_timeout} s, "
        f"seed {args.seed}",
        f"  target                {getattr(args, 'target', 'tiny')}: {target_description}",
        f"  algorithm             {getattr(args, 'algorithm', 'eagle3')}: draft head {type(trainer.draft).__name__}",
        f"  training steps        {steps} in {elapsed:.2f} s ({stats.acked / elapsed:.1f} samples/s acked)",
        f"  bytes moved           {_mb(sum(trainer.sample_bytes.values()))} through the store, "
        f"{_mb(trainer.bytes_read)} materialised by consumers",
        f"  put-to-lease          {_ms(latencies)}  (includes time queued behind other samples)",
        f"  wake-up latency       {_ms(trainer.wakeups)}  (put -> lease of a consumer already waiting)",
        f"  redeliveries          {stats.failed + stats.reclaimed}  ({stats.failed} failed steps, "
        f"{stats.reclaimed} leases reclaimed after {trainer.crashes} consumer crashes, "
        f"{trainer.lost_leases} lost before their step)",
        f"  dead letters          {stats.dead_lettered}",
        f"  producer pauses       {stats.producer_pauses}  (backpressure: pause at 12 samples resident, resume at 4)",
        f"  draft loss            first {first_loss:.4f} -> last {last_loss:.4f}  (mean of the first/last 10 steps)",
        f"  queue stats           put {stats.put}, leased {stats.leased}, acked {stats.acked}, "
        f"stale ops rejected {stats.stale_rejected}",
    ]
    for name, ok in checks.items():
        lines.append(f"  [{'ok' if ok else 'FAILED'}] {name}")
    if acked_twice:
        lines.append(f"  acked twice: {acked_twice[:5]}")
    if never_acked:
        lines.append(f"  never acked: {never_acked[:5]}")
    if leftovers:
        lines.append(f"  left on disk: {leftovers[:5]}")
    for error in errors:
        lines.append(f"  error: {type(error).__name__}: {error}")
    print("\n".join(lines))
    return 0 if all(checks.values()) else 1


def _mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {value}")
    return value
