"""``featurestream queues delete``: remove a finished queue from a shared Redis server.

``delete`` removes every key of the queue ``--name`` (its training ledger's
too), so ``featurestream status`` stops listing it. One atomic server call,
refused (exit 1, nothing deleted) while the queue is open or holds live
leases, unless ``--force`` (its producers' and consumers' next calls then
fail). A kept dead letter's bytes belong to the store, not the queue:
``featurestream dead-letters purge --all`` first frees them. Exit status 2
for usage errors, an unreachable server or a missing queue.
"""

from __future__ import annotations

import argparse
import json
import sys

from featurestream.common.errors import QueueInUse
from featurestream.ops.target import TargetError, add_target_arguments, describe_target, open_target


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    delete = actions.add_parser("delete", help="delete a finished (closed, drained) queue and every key of it")
    add_target_arguments(delete)
    delete.add_argument("--force", action="store_true", help="delete it even while open or with live leases")


def run(args: argparse.Namespace) -> int:
    command = f"featurestream queues {args.action}"
    try:
        with open_target(args, repairs=True) as queue:
            keys = queue.delete(force=args.force)
    except QueueInUse as exc:
        print(f"{command}: refused: {exc}", file=sys.stderr)
        return 1
    except (TargetError, LookupError) as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"url": describe_target(args), "name": args.name, "deleted_keys": keys}))
    else:
        print(f"deleted queue {args.name!r} at {describe_target(args)} ({keys} keys)")
    return 0
