"""Control-plane A/B: CPU per sample lifecycle of this tree against a base revision, in the same run.

    python benchmarks/bench_ab.py [--base 7894b9d] [--samples 1000] [--rounds 7] [--url redis://HOST:PORT/DB]

The base revision is exported with ``git archive`` into a temporary directory. Every measurement runs in a
fresh child process whose ``PYTHONPATH`` puts one tree's ``src`` first, and the rounds alternate this tree
and the base, so both see the same machine load. One lifecycle is put + acquire + ack, refs only (a store
that holds nothing). The shapes:

- ``memory``: ``SampleRefQueue``, one by one; this process's CPU time per lifecycle.
- ``redis-one-by-one`` and ``redis-deep`` (put all, then acquire + ack all): ``RedisSampleRefQueue`` on one
  ``redis-server`` (started here without ``--url``); client plus server CPU per lifecycle, the server's
  from ``INFO cpu``. Each with redis-py's hiredis parser (when installed) and its pure-Python parser.

Prints the best (lowest) round per shape for both trees and their ratio (this tree / base); a ratio above
``--bound`` (default 1.10) is flagged. CPU time rather than wall time, because on a loaded machine the wall
clock mostly measures waiting for a core; the best round rather than the median, because other processes
only ever add to a round's CPU time (cache and core contention), as ``timeit`` reasons.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHAPES = ("memory", "redis-one-by-one", "redis-deep")


# -- the child: one tree, every case --------------------------------------------------------
def lifecycles(queue: object, refs: list[object], deep: bool) -> None:
    if deep:
        for ref in refs:
            queue.put(ref)  # type: ignore[attr-defined]
        for _ in refs:
            queue.ack(queue.acquire(timeout=0))  # type: ignore[attr-defined]
    else:
        for ref in refs:
            queue.put(ref)  # type: ignore[attr-defined]
            queue.ack(queue.acquire(timeout=0))  # type: ignore[attr-defined]


def child(cases: list[tuple[str, str]], samples: int, url: str | None, tree: str) -> list[float]:
    """CPU microseconds per lifecycle of each case, in the featurestream that ``PYTHONPATH`` selects."""
    from bench_redis import NullStore, counting_client, make_ref, server_cpu

    import featurestream

    if not Path(featurestream.__file__).resolve().is_relative_to(Path(tree).resolve()):
        raise SystemExit(f"featurestream came from {featurestream.__file__}, not from {tree}")
    refs = [make_ref(n) for n in range(samples)]
    warm_up = [make_ref(n) for n in range(samples, samples + 200)]
    costs = []
    for shape, parser in cases:
        if shape == "memory":
            for batch in (warm_up, refs):
                queue = featurestream.SampleRefQueue(NullStore())
                started = time.process_time()
                lifecycles(queue, batch, deep=False)
                cpu = time.process_time() - started
        else:
            from featurestream.backends.redis.queue import RedisSampleRefQueue

            assert url is not None
            admin = counting_client(url)
            for batch in (warm_up, refs):
                queue = RedisSampleRefQueue(
                    NullStore(), client=counting_client(url, parser), name=f"ab-{uuid.uuid4().hex}"
                )
                server, started = server_cpu(admin), time.process_time()
                lifecycles(queue, batch, deep=shape == "redis-deep")
                cpu = time.process_time() - started + server_cpu(admin) - server
                assert queue.stats().acked == len(batch)
        costs.append(cpu / samples * 1e6)
    return costs


# -- the parent: trees, rounds, the table ---------------------------------------------------
@contextlib.contextmanager
def base_tree(revision: str) -> Iterator[Path]:
    """``revision`` of this repository, exported into a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as directory:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", revision, "src"],
            check=True,
            capture_output=True,
        ).stdout
        archive_path = Path(directory) / "base.tar"
        archive_path.write_bytes(archive)
        with tarfile.open(archive_path) as tar:
            tar.extractall(directory, filter="data")
        yield Path(directory)


def measure(tree: Path, cases: list[tuple[str, str]], samples: int, url: str | None) -> list[float]:
    src = tree / "src"
    spec = ",".join(f"{shape}:{parser}" for shape, parser in cases)
    command = [sys.executable, __file__, "--child", spec, "--samples", str(samples), "--tree", str(src)]
    command += ["--url", url] if url else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(HERE)])}
    result = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def parsers() -> list[str]:
    from bench_redis import PARSERS

    return list(PARSERS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="7894b9d", help="the revision to compare against (default 7894b9d)")
    parser.add_argument("--samples", type=int, default=1000, help="lifecycles per case and round (default 1000)")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per tree (default 7)")
    parser.add_argument("--url", help="an existing redis-server (default: start one)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"which of {','.join(SHAPES)}")
    parser.add_argument("--bound", type=float, default=1.10, help="flag ratios above this (default 1.10)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--tree", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        cases = [(case.split(":")[0], case.split(":")[1]) for case in args.child.split(",")]
        print(json.dumps(child(cases, args.samples, args.url, args.tree)))
        return
    from bench_redis import redis_server

    cases = [
        (shape, name) for shape in args.shapes.split(",") for name in (parsers() if shape != "memory" else ["python"])
    ]
    # Only the Redis shapes need a server: a memory-only run starts none, so it runs where redis-server is missing.
    server = redis_server(args.url) if any(shape != "memory" for shape, _ in cases) else contextlib.nullcontext()
    with base_tree(args.base) as base, server as url:
        trees = {"this tree": ROOT, f"base {args.base}": base}
        runs: dict[str, list[list[float]]] = {label: [] for label in trees}
        for _ in range(args.rounds):
            for label, tree in trees.items():
                runs[label].append(measure(tree, cases, args.samples, url))
        print(f"CPU us per lifecycle, best of {args.rounds} alternating rounds of {args.samples} samples")
        print(f"  {'shape':18s} {'parser':8s} {'this tree':>10s} {'base':>10s} {'ratio':>7s}")
        worst = 0.0
        for index, (shape, name) in enumerate(cases):
            new, old = (min(run[index] for run in runs[label]) for label in trees)
            ratio = new / old
            worst = max(worst, ratio)
            flag = "  over the bound" if ratio > args.bound else ""
            print(f"  {shape:18s} {name if shape != 'memory' else '-':8s} {new:10.1f} {old:10.1f} {ratio:6.2f}x{flag}")
        print(f"worst ratio {worst:.2f}x (bound {args.bound:.2f}x)")


if __name__ == "__main__":
    main()
