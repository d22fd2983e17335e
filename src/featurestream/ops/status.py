"""``featurestream status``: what a shared Redis queue holds, its counters and rates, its dead letters.

A table by default, one JSON object per line with ``--json`` (the keys of
``featurestream.monitor.status.snapshot`` plus ``url`` and ``name``); ``--watch S``
refreshes every S seconds until Ctrl-C (or ``--count`` refreshes). Without
``--name`` it lists the server's queues and their lifecycle states instead. Exit
status 2 when the server is unreachable, is no Redis server, or holds no queue of
that name.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from featurestream.core.protocol import LeaseQueue
from featurestream.monitor.status import COUNTERS, GAUGES, StatusWatcher
from featurestream.ops import quiet_when_output_closes
from featurestream.ops.target import (
    TargetError,
    add_target_arguments,
    describe_target,
    list_target_queues,
    open_target,
    positive_float,
)

# Clear the terminal and home the cursor, so --watch redraws in place.
_CLEAR = "\x1b[H\x1b[J"


def configure(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser, name_required=False)
    parser.add_argument(
        "--watch",
        type=positive_float,
        metavar="SECONDS",
        help="refresh every SECONDS until Ctrl-C (rates appear from the second refresh on)",
    )
    parser.add_argument(
        "--count", type=int, metavar="N", help="with --watch: stop after N refreshes (default: until Ctrl-C)"
    )
    parser.add_argument(
        "--dead-letters", type=int, default=5, metavar="N", help="newest dead-letter reasons to show (5)"
    )


@quiet_when_output_closes  # `... --watch 5 --json | head -3`
def run(args: argparse.Namespace) -> int:
    if args.count is not None and not args.watch:
        return _fail("--count needs --watch")
    if args.count is not None and args.count < 1:
        return _fail(f"--count must be >= 1, got {args.count}")
    if args.dead_letters < 0:
        return _fail(f"--dead-letters must be >= 0, got {args.dead_letters}")
    if args.name is None:
        if args.watch:
            return _fail("--watch needs --name (the queue to watch)")
        try:
            return _list(args, list_target_queues(args))
        except TargetError as exc:
            return _fail(str(exc))
    try:
        with open_target(args) as queue:
            return _show(queue, args)
    except TargetError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:  # the way out of --watch
        return 0


def _show(queue: LeaseQueue, args: argparse.Namespace) -> int:
    # An operator's handle produces nothing: its own backpressure state says nothing about the producers.
    watcher = StatusWatcher(queue, newest_dead_letters=args.dead_letters, backpressure=False)
    redraw = bool(args.watch) and not args.json and sys.stdout.isatty()
    refreshes = 0
    while True:
        status = {"url": describe_target(args), "name": args.name, **watcher.snapshot()}
        text = json.dumps(status) if args.json else render(status)
        print(_CLEAR + text if redraw else text, flush=True)
        refreshes += 1
        if not args.watch or (args.count is not None and refreshes >= args.count):
            return 0
        if not args.json and not redraw:
            print(flush=True)  # a blank line between tables in a log
        time.sleep(args.watch)


def _list(args: argparse.Namespace, queues: dict[str, str]) -> int:
    url = describe_target(args)
    if args.json:
        print(
            json.dumps({"url": url, "queues": [{"name": name, "lifecycle": state} for name, state in queues.items()]})
        )
        return 0
    print(f"{len(queues)} featurestream queue{'' if len(queues) == 1 else 's'} at {url}" + (":" if queues else ""))
    width = max((len(name) for name in queues), default=0)
    for name, state in queues.items():
        print(f"  {name:{width}}  {state}")
    return 0


def render(status: dict[str, Any]) -> str:
    """The human table of one snapshot (plus ``url``/``name``)."""
    rates = status["rates"]
    age = status["oldest_lease_age_s"]
    lines = [f"queue {status['name']!r} at {status['url']}: {status['lifecycle']}", f"  {'':22}{'now':>12}  rate/s"]
    for key in GAUGES:
        note = ""
        if key == "leased":
            note = "  (no lease out)" if age is None else f"  (oldest lease {age:.1f} s old)"
        lines.append(f"  {key.replace('_', ' '):22}{status[key]:>12}{note}")
    for name in COUNTERS:
        label = "leased (total)" if name == "leased" else name.replace("_", " ")
        rate = "" if rates is None else f"{rates[name]:8.1f}"
        lines.append(f"  {label:22}{status['counters'][name]:>12}{rate}")
    if status["backpressure"] is None:
        lines.append(f"  {'backpressure':22}{'-':>12}  (each producer process has its own; see producer pauses)")
    else:
        lines.append(f"  {'backpressure':22}{status['backpressure']:>12}")
    dead = status["dead_letters"]
    lines.append(f"  {'dead letters':22}{dead['count']:>12}")
    for letter in dead["newest"]:
        lines.append(f"    {letter['sample_id']}  ({_deliveries(letter['deliveries'])})  {letter['reason']}")
    return "\n".join(lines)


def _fail(message: str) -> int:
    print(f"featurestream status: {message}", file=sys.stderr)
    return 2


def _deliveries(count: int) -> str:
    return f"{count} deliver{'y' if count == 1 else 'ies'}"
