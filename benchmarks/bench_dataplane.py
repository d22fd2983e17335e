"""Data plane, producer process -> consumer process: samples/s and GB/s per store, beside the memory-copy limits.

    python benchmarks/bench_dataplane.py [--quick] [--sizes 16,137] [--samples N] [--skip mooncake,reference]

Samples are shaped like an 8B target's EAGLE-3 output for 512 tokens in
bf16 (Llama-3.1-8B: hidden 4096, three auxiliary layers, a 128,256-token
vocabulary): ids and masks (int64), ``aux_hidden_states`` ``[1, 512, 12288]``
and ``logits`` over a 4,096-token draft vocabulary ``[1, 512, 4096]`` (16 MiB a
sample) or the full vocabulary ``[1, 512, 128256]`` (137 MiB).

Every row is measured in the same run, so the ratios compare like with like:

- limits: one copy of the sample into memory already faulted in
  (``dst.copy_(src)``, the same source and target every time: the ratios'
  baseline), the same copy into one of four targets in turn (as a pipeline's
  buffers take turns: what the cache holds of the last copy no longer helps;
  printed, not used in a ratio), two such copies, and a raw ``/dev/shm`` file
  written and read back (fresh file, fresh buffer, unlinked): what a store
  that allocates per sample pays;
- ``local``, one process: ``put`` + ``get`` + ``release`` (two copies, the
  reference's contract), and the hand-over path ``put(take_ownership=True)`` +
  ``get(copy=False)`` (no copy: its time should not grow with the size);
- two processes (``spawn``): a producer ``put``s and ``retain``s (as its queue
  does) and sends the ref over a pipe, at most ``--window`` ahead; the consumer
  ``get``s, ``release``s and acks; the producer ``scrub``s on the ack (as a
  queue in the producer's process does). ``shared`` and ``shared copy=False``
  run ``SharedDirFeatureStore`` on ``/dev/shm``; ``mooncake`` runs
  ``MooncakeFeatureStore`` over TCP loopback against a fresh ``mooncake_master``,
  next to the raw loop (``put_from`` / ``get_into`` of registered buffers, the
  consumer removing each key);
- the reference's stores (``nemo_automodel``'s ``LocalFeatureStore`` and
  ``SharedDirFeatureStore``, when installed), same loops (its consumer's release
  frees the file).

Two-process GB/s: the bytes of the timed samples (at least 1.5 GiB a row by
default: 96 of 16 MiB, 24 of 137 MiB) over the time from the producer's first
timed ``put`` to the consumer's last ``release``, after ``2 * window + 2``
untimed samples (every buffer and slot a steady state takes turns with is made
and faulted in before the clock starts: the window's, the one being read, and
the one the consumer's previous tensors still hold, as in a long run).
``--quick``: a quarter of the samples, for a smoke run. The machine's load is
printed: the two-process rows need two idle cores to mean much. So each
two-process row also prints the CPU time per sample of its busier process
(threads included), and each ratio its CPU-time form (one copy's CPU time, or
the raw loop's busier process's, over it): the rate two idle cores would allow,
which the machine's load moves far less.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reference_baseline
from pair import run_pair

from featurestream import LocalFeatureStore, SharedDirFeatureStore

MiB = 1 << 20
GiB = 1 << 30
TOKENS, HIDDEN, VOCAB, DRAFT_VOCAB = 512, 4096, 128256, 4096
CAPS = {"max_samples": None, "max_bytes": 4 << 30, "high_watermark_bytes": None}
SEGMENT = 1 << 30


def sample(mib: int) -> dict[str, torch.Tensor]:
    """An 8B-shaped EAGLE-3 sample: 16 MiB (draft-vocabulary logits) or 137 MiB (full-vocabulary logits)."""
    generator = torch.Generator().manual_seed(mib)
    tensors = {
        "input_ids": torch.randint(0, VOCAB, (1, TOKENS), generator=generator),
        "attention_mask": torch.ones(1, TOKENS, dtype=torch.int64),
        "loss_mask": torch.ones(1, TOKENS, dtype=torch.int64),
        "aux_hidden_states": torch.randn(1, TOKENS, 3 * HIDDEN, generator=generator).to(torch.bfloat16),
    }
    vocab = DRAFT_VOCAB if mib <= 16 else VOCAB
    tensors["logits"] = torch.randn(1, TOKENS, vocab, generator=generator).to(torch.bfloat16)
    return tensors


def nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def median_seconds(run: Callable[[], None], repeats: int, clock: Callable[[], float] = time.perf_counter) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = clock()
        run()
        times.append(clock() - start)
    return statistics.median(times)


# -- limits -------------------------------------------------------------------------
def copies(tensors: dict[str, torch.Tensor], count: int) -> Callable[[], None]:
    """``count`` successive copies of the sample into memory faulted in beforehand."""
    targets = [{name: t.clone() for name, t in tensors.items()} for _ in range(count)]

    def run() -> None:
        source = tensors
        for target in targets:
            for name, t in source.items():
                target[name].copy_(t)
            source = target

    return run


def rotating_copy(tensors: dict[str, torch.Tensor], turns: int) -> Callable[[], None]:
    """One copy of the sample per call into the next of ``turns`` targets faulted in beforehand."""
    targets = itertools.cycle([{name: t.clone() for name, t in tensors.items()} for _ in range(turns)])

    def run() -> None:
        target = next(targets)
        for name, t in tensors.items():
            target[name].copy_(t)

    return run


def raw_shm(tensors: dict[str, torch.Tensor], directory: str) -> Callable[[], None]:
    """A fresh file written with the sample's bytes, read back into a fresh buffer, unlinked."""
    path = os.path.join(directory, "raw.bin")
    views = [memoryview(t.reshape(-1).view(torch.uint8).numpy()) for t in tensors.values()]
    size = sum(v.nbytes for v in views)

    def run() -> None:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
        for view in views:
            done = 0
            while done < view.nbytes:
                done += os.write(fd, view[done:])
        os.close(fd)
        buffer = torch.empty(size, dtype=torch.uint8)
        target, done = memoryview(buffer.numpy()), 0
        fd = os.open(path, os.O_RDONLY)
        while done < size:
            done += os.readv(fd, [target[done:]])
        os.close(fd)
        os.unlink(path)

    return run


# -- one process: local stores -------------------------------------------------------
def local_round(store: Any, ids: Any, tensors: dict[str, torch.Tensor], reference: bool, fast: bool) -> None:
    if reference:
        ref = store.put(f"s{next(ids)}", tensors, run_id="bench")
        _, handle = store.get(ref)
    elif fast:
        ref = store.put(f"s{next(ids)}", tensors, take_ownership=True)
        _, handle = store.get(ref, copy=False)
    else:
        ref = store.put(f"s{next(ids)}", tensors)
        _, handle = store.get(ref)
    store.release(handle)


# -- two processes ----------------------------------------------------------------------
def make_store(kind: str, run: dict[str, Any], producer: bool) -> Any:
    if kind.startswith("mooncake"):
        from featurestream import MooncakeFeatureStore

        return MooncakeFeatureStore(
            **run["master"], global_segment_size=SEGMENT if producer else 0, namespace=run["namespace"], **CAPS
        )
    if kind == "ref shared":
        reference = reference_baseline.streaming()
        assert reference is not None
        # Its writer's counters never learn of a release in the consumer's process, so a byte cap would refuse
        # puts once the run's total passed it: no cap.
        return reference.SharedDirFeatureStore(
            run["directory"], **{**CAPS, "max_bytes": None, "max_samples": 1 << 30, "low_watermark_bytes": None}
        )
    return SharedDirFeatureStore(run["directory"], orphan_interval=None, **CAPS)


def producer(kind: str, run: dict[str, Any], mib: int, count: int, window: int, peer: Any, cpu: Any) -> None:
    torch.set_num_threads(1)
    tensors = sample(mib)
    raw = kind == "mooncake raw"
    store = raw_client(run, SEGMENT) if raw else make_store(kind, run, True)
    if raw:
        from mooncake.store import ReplicateConfig

        config = ReplicateConfig()
        config.with_hard_pin = True
        size = nbytes(tensors)
        buffer = torch.empty(size, dtype=torch.uint8)
        buffer.copy_(torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors.values()]))
        store.register_buffer(buffer.data_ptr(), size)
    pending: dict[int, Any] = {}
    peer.recv()  # the consumer is ready
    started = spent = 0.0
    for index in range(warmup(window) + count):
        if index == warmup(window):
            while pending:  # the untimed samples are through: every pool is warm
                settle(store, kind, pending.pop(peer.recv()))
            started, spent = time.perf_counter(), time.process_time()
        while len(pending) >= window:
            settle(store, kind, pending.pop(peer.recv()))
        if raw:
            key = f"{run['namespace']}/raw-{index}"
            if store.put_from(key, buffer.data_ptr(), size, config) != 0:
                raise RuntimeError(f"put_from {key} failed")
            pending[index] = key
        elif kind == "ref shared":
            pending[index] = store.put(f"s{index}", tensors, run_id="bench")
        else:
            pending[index] = store.put(f"s{index}", tensors)
            store.retain(pending[index])
        peer.send((index, wire(pending[index])))
    while pending:
        settle(store, kind, pending.pop(peer.recv()))
    cpu.put(time.process_time() - spent)
    peer.send(("done", started))
    peer.recv()
    store.close()


def wire(ref: Any) -> Any:
    """``ref`` as the pipe can carry it: the reference's refs hold mapping proxies, which do not pickle."""
    if not type(ref).__module__.startswith("nemo_automodel"):
        return ref
    return type(ref), {
        f.name: dict(v) if isinstance(v := getattr(ref, f.name), Mapping) else v for f in dataclasses.fields(ref)
    }


def unwire(message: tuple[Any, Any]) -> tuple[Any, Any]:
    index, ref = message
    if isinstance(ref, tuple):
        ref = ref[0](**ref[1])
    return index, ref


def settle(store: Any, kind: str, ref: Any) -> None:
    """The consumer acked ``ref``: the queue's scrub, in the producer's process."""
    if kind in ("shared", "shared copy=False", "mooncake"):
        store.scrub(ref)


def warmup(window: int) -> int:
    """Untimed samples first: every slot and buffer a steady state takes turns with is made and faulted in (the
    window's, the one being read, the one the consumer's previous tensors still hold)."""
    return 2 * window + 2


def consumer(kind: str, run: dict[str, Any], mib: int, window: int, peer: Any, result: Any, cpu: Any) -> None:
    torch.set_num_threads(1)
    raw = kind == "mooncake raw"
    store = raw_client(run, 0) if raw else make_store(kind, run, False)
    size = nbytes(sample(mib)) if raw else 0
    if raw:
        buffer = torch.empty(size, dtype=torch.uint8)
        store.register_buffer(buffer.data_ptr(), size)
    copy = kind != "shared copy=False"
    peer.send("ready")
    last, spent = time.perf_counter(), time.process_time()
    while True:
        index, ref = unwire(peer.recv())
        if index == "done":
            cpu.put(time.process_time() - spent)
            result.put(last - ref)
            break
        if index == warmup(window):
            spent = time.process_time()
        if raw:
            if store.get_into(ref, buffer.data_ptr(), size) != size:
                raise RuntimeError(f"get_into {ref} failed")
            store.remove(ref, True)
        else:
            _, handle = store.get(ref) if copy else store.get(ref, copy=False)
            store.release(handle)
        last = time.perf_counter()
        peer.send(index)
    peer.send("bye")
    store.close()


def raw_client(run: dict[str, Any], segment: int) -> Any:
    """A client of the raw loop, set up as ``MooncakeFeatureStore`` sets up its own (``stores.mooncake_client``)."""
    from featurestream.stores.mooncake_client import load_mooncake

    MooncakeDistributedStore = load_mooncake().MooncakeDistributedStore

    client = MooncakeDistributedStore()
    master = run["master"]
    rc = client.setup(
        master["local_hostname"],
        master["metadata_server"],
        segment,
        64 * MiB,
        "tcp",
        "",
        master["master_server_address"],
    )
    if rc != 0:
        raise RuntimeError(f"Mooncake setup failed: {rc}")
    return client


def two_processes(kind: str, run: dict[str, Any], mib: int, count: int, window: int) -> tuple[float, float]:
    """Seconds for ``count`` timed samples from producer to consumer, in two fresh processes, and the CPU seconds
    of the busier process over them (its threads included)."""
    ctx = mp.get_context("spawn")
    producer_end, consumer_end = ctx.Pipe()
    result, cpu = ctx.Queue(), ctx.Queue()
    procs = [
        ctx.Process(target=producer, args=(kind, run, mib, count, window, producer_end, cpu)),
        ctx.Process(target=consumer, args=(kind, run, mib, window, consumer_end, result, cpu)),
    ]
    seconds = run_pair(kind, procs, result)
    return seconds, max(cpu.get(timeout=10), cpu.get(timeout=10))


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min) / {five:.2f} (5 min) on {os.cpu_count()} cores"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples and repeats (a smoke run)")
    parser.add_argument("--sizes", default="16,137", help="sample sizes in MiB: 16 and/or 137 (default both)")
    parser.add_argument(
        "--samples", type=int, help="timed samples per two-process run (default: 1.5 GiB, at least 24; --quick 1/4)"
    )
    parser.add_argument("--window", type=int, default=2, help="samples the producer may run ahead (default 2)")
    parser.add_argument("--skip", default="", help="comma-separated: mooncake, reference")
    parser.add_argument("--only", default="", help="comma-separated two-process rows to run (default all)")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    sizes = [int(size) for size in args.sizes.split(",")]
    repeats = 3 if args.quick else 9
    torch.set_num_threads(1)
    reference = None if "reference" in skip else reference_baseline.streaming()
    master_cm: Any = None
    if "mooncake" not in skip:
        try:
            from featurestream.tools.mooncake import MooncakeMaster

            master_cm = MooncakeMaster()
            master_cm.__enter__()
        except (ImportError, FileNotFoundError) as exc:
            print(f"(mooncake rows skipped: {exc})\n")
            master_cm = None
    print(f"torch {torch.__version__}, 1 thread per process; {load()}")
    try:
        with tempfile.TemporaryDirectory(
            prefix="fs-dataplane-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
        ) as d:
            only = set(filter(None, args.only.split(",")))
            for mib in sizes:
                count = args.samples or max(24, -(-3 * GiB // 2 // nbytes(sample(mib)))) // (4 if args.quick else 1)
                report(mib, d, count, repeats, args.window, reference, master_cm, only)
    finally:
        if master_cm is not None:
            master_cm.__exit__(None, None, None)
    print(f"\nafter: {load()}")


def report(
    mib: int, directory: str, count: int, repeats: int, window: int, reference: Any, master: Any, only: set[str]
) -> None:
    tensors = sample(mib)
    size = nbytes(tensors)
    gbps: dict[str, float] = {}
    cpu_ms: dict[str, float] = {}  # CPU per sample: of the copy, of the busier process of a two-process row
    zero_us = 0.0
    gbps["1 copy (faulted)"] = size / median_seconds(copies(tensors, 1), repeats) / 1e9
    cpu_ms["1 copy (faulted)"] = median_seconds(copies(tensors, 1), repeats, time.thread_time) * 1e3
    gbps["1 copy (4 targets in turn)"] = size / median_seconds(rotating_copy(tensors, 4), repeats) / 1e9
    gbps["2 copies (faulted)"] = size / median_seconds(copies(tensors, 2), repeats) / 1e9
    gbps["raw /dev/shm write+read"] = size / median_seconds(raw_shm(tensors, directory), repeats) / 1e9
    ids = itertools.count()
    local = LocalFeatureStore(**CAPS)
    gbps["local"] = size / median_seconds(lambda: local_round(local, ids, tensors, False, False), repeats) / 1e9
    zero = median_seconds(lambda: local_round(local, ids, tensors, False, True), repeats)
    zero_us = zero * 1e6
    local.close()
    if reference is not None:
        ref_local = reference.LocalFeatureStore(**{**CAPS, "low_watermark_bytes": None})
        gbps["ref local"] = (
            size / median_seconds(lambda: local_round(ref_local, ids, tensors, True, False), repeats) / 1e9
        )
        ref_local.close()
    kinds = ["shared", "shared copy=False"]
    if reference is not None:
        kinds.append("ref shared")
    if master is not None:
        kinds += ["mooncake raw", "mooncake"]
    for kind in [kind for kind in kinds if not only or kind in only]:
        run = {"directory": os.path.join(directory, kind.replace(" ", "-").replace("=", "-")), "namespace": kind}
        os.makedirs(run["directory"], exist_ok=True)
        if master is not None:
            run["master"] = master.store_kwargs()
            run["master"].pop("protocol")
            run["namespace"] = f"bench-{mib}-{kind.replace(' ', '-')}"
        seconds, cpu = two_processes(kind, run, mib, count, window)
        gbps[kind], cpu_ms[kind] = count * size / seconds / 1e9, cpu / count * 1e3
    print(f"\n{mib} MiB samples ({size / MiB:.1f} MiB each, {count} timed two-process samples):")
    for name, value in gbps.items():
        busy = f"  {cpu_ms[name]:6.2f} ms CPU/sample" if name in cpu_ms else ""
        print(f"  {name:28s} {value:7.2f} GB/s  {value * 1e9 / size:8.1f} samples/s{busy}")
    print(f"  {'local take_ownership+copy=False':28s} {zero_us:7.1f} us per put+get+release")
    one, two = gbps["1 copy (faulted)"], gbps["2 copies (faulted)"]
    copy_ms = cpu_ms["1 copy (faulted)"]

    def by_cpu(kind: str, base: float = copy_ms) -> str:
        return f"   CPU time: {base / cpu_ms[kind]:5.2f}x"

    print("  ratios (same run; CPU time: of the busier process per sample, what two idle cores would allow):")
    print(f"    local default / 2 copies          {gbps['local'] / two:5.2f}x  (target >= 0.5)")
    if "shared" in gbps:
        print(f"    shared default / 1 copy           {gbps['shared'] / one:5.2f}x  (target >= 0.5){by_cpu('shared')}")
        print(f"    shared default / raw /dev/shm     {gbps['shared'] / gbps['raw /dev/shm write+read']:5.2f}x")
    if "shared copy=False" in gbps:
        print(
            f"    shared copy=False / 1 copy        {gbps['shared copy=False'] / one:5.2f}x  (target >= 0.8)"
            + by_cpu("shared copy=False")
        )
    if "ref local" in gbps:
        print(f"    local / ref local                 {gbps['local'] / gbps['ref local']:5.2f}x")
    if "ref shared" in gbps and "shared" in gbps:
        print(f"    shared / ref shared               {gbps['shared'] / gbps['ref shared']:5.2f}x")
    if "mooncake" in gbps and "mooncake raw" in gbps:
        print(
            f"    mooncake / raw loop               {gbps['mooncake'] / gbps['mooncake raw']:5.2f}x  (target >= 0.8)"
            + by_cpu("mooncake", cpu_ms["mooncake raw"])
        )


if __name__ == "__main__":
    main()
