"""Fixed costs of the shared directory's calls, one process: microseconds per put, retain, get, release and scrub.

    python benchmarks/bench_store_calls.py [--samples 300] [--copy-false]

A sample of a 512-token EAGLE-3 shape with its large features cut to a few
values (8 KiB in all), so what is timed is what a sample costs besides its
copies: syscalls, bookkeeping, the header. A writer and a reader instance on
one ``/dev/shm`` directory, each call timed alone (``time.perf_counter``) and
the median printed; ``--copy-false`` times ``get(copy=False)``. Run with
``PYTHONPATH`` at another tree to compare.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch

from featurestream import SharedDirFeatureStore

CALLS = ("put", "retain", "get", "release", "scrub")


def sample() -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.zeros(1, 512, dtype=torch.int64),
        "attention_mask": torch.ones(1, 512, dtype=torch.int64),
        "loss_mask": torch.ones(1, 512, dtype=torch.int64),
        "aux_hidden_states": torch.zeros(1, 4, 12, dtype=torch.bfloat16),
        "logits": torch.zeros(1, 4, 4, dtype=torch.bfloat16),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300, help="timed samples (default 300, after 20 untimed)")
    parser.add_argument("--copy-false", action="store_true", help="time get(copy=False)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tensors = sample()
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as directory:
        writer = SharedDirFeatureStore(directory, orphan_interval=None, max_samples=None, max_bytes=1 << 30)
        reader = SharedDirFeatureStore(directory, orphan_interval=None, max_samples=None, max_bytes=1 << 30)
        spent: dict[str, list[float]] = {call: [] for call in CALLS}
        for index in range(20 + args.samples):
            clock = [time.perf_counter()]
            ref = writer.put(f"s{index}", tensors)
            clock.append(time.perf_counter())
            writer.retain(ref)
            clock.append(time.perf_counter())
            got, handle = reader.get(ref, copy=not args.copy_false)
            clock.append(time.perf_counter())
            reader.release(handle)
            clock.append(time.perf_counter())
            del got
            writer.scrub(ref)
            clock.append(time.perf_counter())
            if index >= 20:
                for call, start, end in zip(CALLS, clock[:-1], clock[1:], strict=True):
                    spent[call].append((end - start) * 1e6)
        writer.close()
        reader.close()
    one, five, _ = os.getloadavg()
    print(f"median of {args.samples} samples, load average {one:.2f} / {five:.2f} on {os.cpu_count()} cores")
    print("  ".join(f"{call} {statistics.median(times):6.1f} us" for call, times in spent.items()))


if __name__ == "__main__":
    main()
