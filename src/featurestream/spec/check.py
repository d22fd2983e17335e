"""``featurestream check``: model-check ``spec/LeaseQueue.tla`` with TLC and print the verdict."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from featurestream.spec.tlc import ToolMissing, run_tlc, spec_dir

CI_CONFIG = "LeaseQueue.cfg"
DEEP_CONFIG = "LeaseQueueDeep.cfg"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``check`` options to ``parser``."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--config", type=Path, help="a TLC model config (default: the CI model, spec/LeaseQueue.cfg)")
    which.add_argument("--deep", action="store_true", help="the larger nightly model (spec/LeaseQueueDeep.cfg)")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="TLC worker threads (default: all cores)"
    )
    parser.add_argument("--verbose", action="store_true", help="print TLC's full output")


def run(args: argparse.Namespace) -> int:
    """Run TLC; exit 0 when no error is found, 1 on a violation, 2 when TLC cannot run."""
    try:
        config = args.config or spec_dir() / (DEEP_CONFIG if args.deep else CI_CONFIG)
        print(f"model-checking {spec_dir() / 'LeaseQueue.tla'} with {config} ...", flush=True)
        result = run_tlc(config, workers=args.workers)
    except (ToolMissing, FileNotFoundError, ValueError) as error:
        print(f"featurestream check: {error}")
        return 2
    if args.verbose or not result.ok:
        print(result.output)
    print(result.summary())
    return 0 if result.ok else 1
