"""``featurestream`` command line: one subcommand per module, imported on use."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

DESCRIPTION = "featurestream command line: one subcommand per module, imported on use."  # plain text: users read it

# Each module exposes ``configure(parser)`` and ``run(args) -> int``.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("featurestream.tools.demo", "stream samples end to end and print a summary"),
    "check": ("featurestream.spec.check", "model-check spec/LeaseQueue.tla with TLC"),
    "diagrams": ("featurestream.tools.diagrams", "write the state diagrams as DOT, SVG or PNG (the last two need dot)"),
    "status": ("featurestream.ops.status", "show a Redis queue: depth, leases, counters and rates, dead letters"),
    "dead-letters": ("featurestream.ops.dead_letters", "list, requeue or purge a Redis queue's dead letters"),
    "queues": ("featurestream.ops.queues", "delete a finished Redis queue"),
    "serve": ("featurestream.tools.serve", "start redis-server, a Sentinel cluster or mooncake_master for local use"),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="featurestream", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {}
    wanted = (list(argv) if argv is not None else sys.argv[1:])[:1]
    for name, (module_name, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        # Only the chosen command's module is imported: torch-free commands stay fast.
        if name in wanted:
            modules[name] = importlib.import_module(module_name)
            modules[name].configure(sub)
    args = parser.parse_args(argv)
    return int(modules[args.command].run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
