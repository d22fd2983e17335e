"""Trainer-wait benchmark: time per training step with FeatureDataLoader(prefetch=0) and (prefetch=2), against the step.

    python benchmarks/bench_trainer_wait.py [--samples 24] [--rounds 3] [--step-ms 20] [--step sleep|compute]

A trainer loop runs a fixed synthetic step over a ``SharedDirFeatureStore`` of
realistic EAGLE-3 samples (the shapes of a small model: seq 2048, hidden 512 so
``aux_hidden_states`` is 2048 x 1536 fp16, logits over a 4096-token vocabulary
in fp16: 22 MiB a sample). The step is ``sleep`` (default: ``time.sleep``,
what a GPU trainer's CPU thread does while its kernels run, and the only step
that stays stable on a busy shared machine) or ``compute`` (a matmul loop on
one torch thread calibrated at start to ``--step-ms``: a CPU-bound trainer,
which competes with the reader thread for the cores). Per round, for each
variant the queue is refilled (the samples are written to the directory and
put; not timed) and the trainer loop is timed over every step after the first:

- ``step alone``: the step, no loader (the baseline);
- ``prefetch=0``: lease, read, materialise on the trainer's thread, then step;
- ``prefetch=2``: a background thread reads ahead while the trainer steps.

It prints the load average before and after (the machine's other jobs take
cores from the trainer and the reader), the median time per step of each
variant over ``--rounds`` rounds,
its ratio to the step alone, and the time one ``store.get`` of a sample takes
(median, measured in the same run). Target (issue 11): prefetch=2 <= 1.1x the
step alone whenever reading a sample takes less than a step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from featurestream import FeatureDataLoader, SampleRefQueue, SharedDirFeatureStore

SEQ = 2048
HIDDEN = 512
VOCAB = 4096
MiB = 1024 * 1024


def sample(index: int) -> dict[str, torch.Tensor]:
    """One EAGLE-3 sample of a small model (22 MiB)."""
    generator = torch.Generator().manual_seed(index)
    return {
        "aux_hidden_states": torch.randn(1, SEQ, 3 * HIDDEN, generator=generator).half(),
        "input_ids": torch.randint(0, VOCAB, (1, SEQ), generator=generator),
        "attention_mask": torch.ones(1, SEQ, dtype=torch.long),
        "loss_mask": torch.ones(1, SEQ, dtype=torch.long),
        "logits": torch.randn(1, SEQ, VOCAB, generator=generator).half(),
    }


def compute_step(step_s: float) -> Callable[[], None]:
    """A matmul loop calibrated to take ``step_s`` seconds on this machine now (one torch thread)."""
    # Few large ops, as a GPU step's kernels are few and long: a loop of tiny ops would measure GIL hand-offs.
    a = torch.randn(384, 384) / 20

    def matmuls(count: int) -> None:
        x = a
        for _ in range(count):
            x = torch.tanh(x @ a)

    matmuls(5)
    count = 4
    while True:
        start = time.perf_counter()
        matmuls(count)
        elapsed = time.perf_counter() - start
        if elapsed > 0.2:
            break
        count *= 2
    per_step = max(1, round(count * step_s / elapsed))
    return lambda: matmuls(per_step)


def sleep_step(step_s: float) -> Callable[[], None]:
    return lambda: time.sleep(step_s)


def fill(directory: Path, samples: list[dict[str, torch.Tensor]]) -> tuple[SampleRefQueue, SharedDirFeatureStore]:
    """A closed queue over a fresh shared-dir store holding every sample (written now, so in the page cache)."""
    store = SharedDirFeatureStore(directory, max_samples=None, max_bytes=1 << 40)
    queue = SampleRefQueue(store)
    for index, tensors in enumerate(samples):
        queue.put(store.put(f"s{index}", tensors))
    queue.close()
    return queue, store


def time_loop(step: Callable[[], None], batches: object, count: int) -> float:
    """Seconds per step over every step after the first (the first includes starting up)."""
    iterator = iter(batches)  # type: ignore[call-overload]
    next(iterator)
    step()
    start = time.perf_counter()
    done = 0
    for _ in iterator:
        step()
        done += 1
    elapsed = time.perf_counter() - start
    assert done == count - 1, f"expected {count - 1} more batches, got {done}"
    return elapsed / done


def read_time(directory: Path, samples: list[dict[str, torch.Tensor]]) -> float:
    """Median seconds of one ``store.get`` of a sample just written to the shared directory (as the loader reads)."""
    store = SharedDirFeatureStore(directory, max_samples=None, max_bytes=1 << 40)
    times = []
    for index, tensors in enumerate(samples[:5]):
        ref = store.put(f"r{index}", tensors)
        start = time.perf_counter()
        _, handle = store.get(ref)
        times.append(time.perf_counter() - start)
        store.release(handle)  # the last handle of a sample no queue holds: the file goes
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=24, help="samples (steps) per timed loop")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of all variants; medians are reported")
    parser.add_argument("--step-ms", type=float, default=20.0, help="the synthetic step's duration")
    parser.add_argument("--step", choices=("sleep", "compute"), default="sleep")
    parser.add_argument("--dir", default=None, help="directory for the shared-dir store (default: a temp dir)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the trainer's compute takes one core; the prefetch thread reads on the other
    step = (compute_step if args.step == "compute" else sleep_step)(args.step_ms / 1000)
    samples = [sample(index) for index in range(args.samples)]
    size_mib = sum(t.numel() * t.element_size() for t in samples[0].values()) / MiB
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        directory = Path(root) / "store"
        results: dict[str, list[float]] = {"step alone": [], "prefetch=0": [], "prefetch=2": []}
        reads = []
        load_before = os.getloadavg()[0]
        for _ in range(args.rounds):
            results["step alone"].append(time_loop(step, range(args.samples), args.samples))
            for prefetch in (0, 2):
                queue, store = fill(directory, samples)
                loader = FeatureDataLoader(queue, SharedDirFeatureStore(directory), prefetch=prefetch)
                results[f"prefetch={prefetch}"].append(time_loop(step, loader, args.samples))
                loader.close()
                assert store.health().sample_count == 0
            reads.append(read_time(directory, samples))
        load_after = os.getloadavg()[0]
    alone = statistics.median(results["step alone"])
    read = statistics.median(reads)
    print(
        f"{args.samples} samples of {size_mib:.1f} MiB, {args.rounds} rounds, step={args.step} "
        f"({args.step_ms:g} ms target), shared-dir store in {args.dir or tempfile.gettempdir()}, "
        f"load average {load_before:.1f} before, {load_after:.1f} after"
    )
    print(f"one store.get of a sample: {read * 1000:.1f} ms ({read / alone:.2f}x the step)")
    print(f"{'variant':<12} {'ms/step':>8} {'x step alone':>13}")
    for name, values in results.items():
        per_step = statistics.median(values)
        print(f"{name:<12} {per_step * 1000:8.1f} {per_step / alone:13.2f}")
    ratio = statistics.median(results["prefetch=2"]) / alone
    verdict = "met" if ratio <= 1.1 else ("not met" if read < alone else "n/a: a read takes longer than a step")
    print(f"target prefetch=2 <= 1.10x step alone (when a read < a step): {ratio:.2f}x, {verdict}")


if __name__ == "__main__":
    main()
