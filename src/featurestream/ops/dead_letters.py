"""``featurestream dead-letters list|requeue|purge``: inspect and repair a shared Redis queue's dead letters.

``list`` prints them oldest first. ``requeue`` sends the named ones (or
``--all``) back to the queue with a fresh delivery budget -- only those whose
bytes the queue kept (``keep_dead_letter_bytes``); ``purge`` drops them for
good (and their kept bytes). Each is one atomic server call: a refused
request (an unknown id, bytes not kept) changes nothing and exits 1 naming the
id. A purged dead letter's kept bytes in a shared directory (``file://`` store)
are freed by the command itself, data file, marker and link: the producer that
wrote them may have exited, and this process is the one that knows they are
released (exit 1, naming the directory, if it cannot remove them). Neither
acts on nothing: give ids or ``--all``. Exit status 2 for usage errors, an
unreachable server or a missing queue.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from featurestream.ops import quiet_when_output_closes
from featurestream.ops.target import TargetError, add_target_arguments, describe_target, open_target

if TYPE_CHECKING:
    from featurestream.common.refs import SampleRef


def configure(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="list the dead letters, oldest first")
    add_target_arguments(listing)
    for action, help_text in (
        ("requeue", "send dead letters back to the queue with a fresh delivery budget (needs their kept bytes)"),
        ("purge", "drop dead letters for good, with their kept bytes"),
    ):
        sub = actions.add_parser(action, help=help_text)
        add_target_arguments(sub)
        sub.add_argument("ids", nargs="*", metavar="SAMPLE_ID", help=f"the dead letters to {action}")
        sub.add_argument("--all", action="store_true", help=f"{action} every dead letter")


@quiet_when_output_closes  # `... list | head`
def run(args: argparse.Namespace) -> int:
    command = f"featurestream dead-letters {args.action}"
    if args.action != "list":
        if not args.ids and not args.all:
            return _say(command, f"name the sample ids to {args.action}, or pass --all (refusing to act on nothing)", 2)
        if args.ids and args.all:
            return _say(command, "pass either sample ids or --all, not both", 2)
    try:
        with open_target(args, repairs=args.action != "list") as queue:
            if args.action == "list":
                return _list(queue, args)
            return _repair(queue, args, command)
    except TargetError as exc:
        return _say(command, str(exc), 2)


def _list(queue: Any, args: argparse.Namespace) -> int:
    letters = [
        {"sample_id": d.ref.sample_id, "reason": d.reason, "deliveries": d.deliveries} for d in queue.dead_letters()
    ]
    if args.json:
        print(json.dumps({"url": describe_target(args), "name": args.name, "dead_letters": letters}))
        return 0
    print(f"{_plural(len(letters))} in queue {args.name!r} at {describe_target(args)}")
    if letters:
        width = max(len("sample id"), *(len(letter["sample_id"]) for letter in letters))
        print(f"  {'sample id':{width}}  deliveries  reason")
        for letter in letters:
            print(f"  {letter['sample_id']:{width}}  {letter['deliveries']:>10}  {letter['reason']}")
    return 0


def _repair(queue: Any, args: argparse.Namespace, command: str) -> int:
    purging = args.action == "purge"
    refs = {letter.ref.sample_id: letter.ref for letter in queue.dead_letters()} if purging else {}
    method = queue.purge_dead_letters if purging else queue.requeue_dead_letters
    try:
        done = method(None if args.all else list(args.ids))
    except (ValueError, LookupError) as exc:  # refused as a whole: nothing changed
        return _say(command, f"refused: {exc}", 1)
    past = "purged" if purging else "requeued"
    if args.json:
        print(json.dumps({"url": describe_target(args), "name": args.name, past: done}))
    else:
        print(f"{past} {_plural(len(done))}" + (f": {', '.join(done)}" if done else ""))
    try:
        _free_shared_bytes(refs[sample_id] for sample_id in done if sample_id in refs)
    except OSError as exc:
        return _say(command, f"purged, but could not remove their bytes: {exc}", 1)
    return 0


def _free_shared_bytes(refs: Iterable[SampleRef]) -> None:
    """Scrub purged dead letters' bytes in the shared directory each ref names (``file://``): a kept dead letter's
    file, marker and link stay until a store scrubs them, and the instance that wrote them may be gone. Bytes
    scrubbed already (not kept, or scrubbed by their writer meanwhile) make this a no-op; a later incarnation of
    the id is never touched (its files carry another incarnation)."""
    stores: dict[str, Any] = {}
    for ref in refs:
        directory = ref.store_uri.removeprefix("file://")
        if directory == ref.store_uri or not os.path.isdir(directory):
            continue  # in a process's memory or a Mooncake segment (gone with its writer), or not on this host
        if directory not in stores:
            from featurestream.stores.shared_dir import SharedDirFeatureStore  # torch: only when needed

            stores[directory] = SharedDirFeatureStore(directory, create=False)
        stores[directory].scrub(ref)
    for store in stores.values():
        store.close()


def _plural(count: int) -> str:
    return f"{count} dead letter{'' if count == 1 else 's'}"


def _say(command: str, message: str, status: int) -> int:
    print(f"{command}: {message}", file=sys.stderr)
    return status
