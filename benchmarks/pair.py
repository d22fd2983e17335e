"""Two benchmark processes (a producer and a consumer) run to the one result they report.

The benchmarks run as scripts (``python benchmarks/bench_*.py``), so this directory is on ``sys.path``.
"""

from __future__ import annotations

import queue
import time
from typing import Any


def run_pair(name: str, procs: list[Any], result: Any, limit: float = 600) -> float:
    """Start ``procs``, wait for the float one of them puts on ``result``, join them; ``RuntimeError`` when one fails.

    Processes still alive on the way out (a failure, ``limit`` seconds passed) are killed.
    """
    for proc in procs:
        proc.start()
    try:
        give_up = time.monotonic() + limit
        while True:
            try:
                value = float(result.get(timeout=1))
                break
            except queue.Empty:
                if any(proc.exitcode not in (None, 0) for proc in procs) or time.monotonic() > give_up:
                    raise RuntimeError(f"{name}: a benchmark process failed: {[p.exitcode for p in procs]}") from None
        for proc in procs:
            proc.join(timeout=120)
        if any(proc.exitcode != 0 for proc in procs):
            raise RuntimeError(f"{name}: a benchmark process failed: {[proc.exitcode for proc in procs]}")
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
    return value
