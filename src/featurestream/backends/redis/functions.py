"""Server-side Lua for ``RedisSampleRefQueue``: one Redis Functions library, every state change one atomic call.

Needs Redis 7.0+ (``FUNCTION LOAD`` / ``FCALL``). The library is loaded once per
server (and persisted with the dataset, AOF included); its helpers are compiled
and defined at load time, so a call pays only for its own commands. Function
names carry a hash of the source (``fs_<tag>_<script>``), so clients of
different versions never call each other's code.

The Lua lives in package resources next to this module: ``lua/prelude.lua``
and ``lua/prelude_calls.lua`` (the helpers every function shares) and ``lua/<function>.lua`` (one body per
function, see ``FUNCTIONS``). Every constant the Lua uses (``LAYOUT``,
``REAP_LIMIT``, ``FEED_LIMIT`` ...) is defined once below, in ``CONSTANTS``, and
prepended to the prelude as a Lua local, so Python and Lua cannot disagree.

Key layout (``LAYOUT``): ``KEYS[1]`` is the prefix ``featurestream:{name}:`` and
every key is the prefix plus one of these names (one ``{name}`` hash tag, so they
share a cluster slot; the functions derive the names rather than take fourteen
KEYS, which would cost more to send than most calls cost to run):

1. ``pending``   list of deliveries waiting for a lease, ``n \\t sample id`` (``n``: the
                 redelivery count), FIFO: put and redelivery RPUSH, acquire LPOPs. Each
                 delivery attempt is a new entry, so a failed, reclaimed or given-back
                 sample goes to the tail (given back: with its ``n`` unchanged). A list
                 rather than a stream and consumer group: XADD, XREADGROUP, XACK and trims
                 cost more server time per sample than RPUSH and LPOP (docs/performance.md),
                 and the lease record holds all a PEL entry would.
2. ``refs``      hash sample id -> ``put token \\t ref JSON`` for every held
                 (pending or leased) sample; the put token makes a retried put idempotent.
3. ``leases``    hash lease key -> lease record (live leases): the fields ``wire.LEASE_FIELDS`` -- ``issued``
                 (the server's TIME when leased, for ``oldest_lease_age``), ``token``, ``n``, ``put`` (put
                 token), ``sample`` -- tab-separated in that order; the Lua codec is generated from that list
                 (``_record_codec``), ``wire.lease_fields`` is the Python one.
4. ``deadlines`` zset lease key -> deadline (seconds); the reap index.
5. ``done``      hash sample id -> the fields ``DONE_FIELDS`` (outcome, lease key, lease token, put token),
                 tab-separated in that order (codec generated as the lease record's): the dedup window, also
                 used to make retried ack/fail/put idempotent.
6. ``done_order`` list of sample ids in retirement order (evicts the window's oldest).
7. ``dead``      list of dead letters: JSON with named fields ``sample``, ``ref`` (the ref JSON as text),
                 ``reason``, ``deliveries`` (``wire.dead_letter_from_json``, ``wire.DEAD_LETTER_FIELDS``).
8. ``meta``      hash: ``state`` (open/draining/drained), fixed config (``max_deliveries``,
                 ``dedup_window``, ``keep_bytes``), ``kept_bytes``, ``waiting`` (until when,
                 server seconds, a consumer that found nothing to lease may be blocked on
                 ``wake``: while it may, every call that makes a sample pending appends to ``wake``),
                 ``cause`` (why a failed producer closed the queue, when one did).
9. ``stats``     hash of the ``QueueStats`` counters, plus ``requeued`` and ``purged``. ``leased``
                 doubles as the lease id sequence; the ``pending`` gauge is derived (``PENDING_TERMS``:
                 put + failed + reclaimed + requeued + given_back - dead_lettered - leased: every ``pending``
                 entry is a put, a redelivery, a requeue or a give-back).
10. ``wake``     stream (capped at one entry) a close, a drain, and a new pending delivery
                 while a consumer waits append to, so blocked ``acquire`` calls wake (``XREAD BLOCK``).
11. ``retired``  stream of settled sample ids (capped): a producing instance reads
                 it to scrub, in its own store, the samples it put that another
                 process acked or dead-lettered (its residency counters would
                 otherwise never fall, and backpressure never resume). A sample
                 acked or failed by the instance that put it (same first
                 ``INSTANCE_CHARS`` of put and lease token) is not fed: that
                 instance scrubs it on the reply.
12. ``kept``     hash sample id -> estimated bytes of the dead letters whose bytes stay retained
                 (``keep_dead_letter_bytes``, their total in ``meta`` ``kept_bytes``) so that
                 ``requeue`` can deliver them again; ``purge`` releases them.
13. ``calls``    hash instance id (a call id's first ``INSTANCE_CHARS``: the client's ``Link``) -> ``call id :
                 keep \\t reply JSON``: that instance's last remembered call, whose retry after a lost reply gets this
                 reply rather than acting, counting or reaping again. A call is remembered when it is one of
                 ``REMEMBERED`` (their effects leave nothing else a retry could recognise them by), when it
                 rejects a lease or refuses a put by the dedup window (counted once), and when its reply
                 reports an event other than a feed settle: a reap's reclaims and dead letters (their scrubs
                 and ``on_dead_letter`` callbacks), a drain, and every event of a traced call (so a retry
                 traces what its first run did, counts included). An untraced put, acquire or ack that reaps
                 nothing writes nothing here.
14. ``calls_due`` zset instance id -> when (the call's clock) its ``calls`` entry is dropped: ``MEMO_SECONDS``
                 or twice the instance's ``reconnect_timeout``, whichever is longer, after the call. ``init``
                 and ``reclaim`` (the reaper's call) drop the entries whose time is up; an instance's
                 ``disconnect`` drops its own.
15. ``malformed`` list of the ``pending`` entries that were not ``n \\t sample id`` (written by
                 something other than these functions): ``acquire`` moves each aside once, as a dead
                 letter of reason ``malformed`` with its raw bytes (``malformed \\t <entry>``), and reports
                 it (event ``malformed``, logged once by the client); it is never leased.

Lease keys are the lease id zero-padded to 16 digits, so the deadline zset
orders ties by lease id exactly like the in-process queue's heap.

``ARGV[1]`` is a tab-separated header: ``now`` in seconds (empty: the server's
``TIME``, which every node agrees on), max_deliveries, dedup_window, the
caller's cursor in ``retired`` (empty: not wanted; ``$``: the caller holds no
unsettled puts, so just report the newest id), ``1`` when the caller
traces, then (added by the ``Link``) one field: ``+`` when the request may
repeat one the server ran (a retry, or any request redis-py sends: it retries by
itself; only such a call looks in ``calls``) or ``-``, the call id, ``:`` and
how many seconds a remembered reply is kept; ``ARGV[2:]`` are per function.
Every function except ``init`` and ``close`` first reaps due leases (at most
``REAP_LIMIT``), as every in-process queue operation does.
Functions return ``{status, events, ...}`` (``ack``, ``fail``, ``lose``,
``reject`` and ``give_back``, which take a batch of leases, ``{statuses, events}``;
``reject`` takes the dead letters' reason first) where ``events`` is a flat list of
``kind, a, b`` triples the client turns into tracer calls, scrubs and
dead-letter callbacks; a traced call's events are quadruples, the fourth
being the state the event left, computed in the same atomic call: JSON with
the named fields ``wire.EVENT_STATE_FIELDS`` (the lease's redelivery count, the
counts after the event, the call's clock, a lease's deadline; ``''`` where
none; ``wire.event_state`` decodes it). An
untraced call reads nothing for them and gets only the events it acts on.
``kind`` uses the lease/lifecycle machines' trigger names (``lease``,
``extend``, ``ack``, ``fail``, ``give_back``, ``reclaim``, ``close``, ``drain``) plus
``put``, ``dead`` (``kept``: a dead letter whose bytes stay), ``dedup``,
``stale``, ``forged`` (a stale lease naming a live one: a copy),
``requeue``, ``purge``, ``retired`` (not traced) and ``malformed`` (a pending entry moved aside).
"""

from __future__ import annotations

import hashlib
from importlib import resources

from featurestream.backends.redis.wire import LEASE_FIELDS

KEY_NAMES = (
    "pending",
    "refs",
    "leases",
    "deadlines",
    "done",
    "done_order",
    "dead",
    "meta",
    "stats",
    "wake",
    "retired",
    "kept",
    "calls",
    "calls_due",
    "malformed",
)

LAYOUT = "4"  # key layout version, stored in ``meta``: a client refuses a queue of another layout
REAP_LIMIT = 1000  # most leases one call reaps, to keep the server responsive
FEED_LIMIT = 1000  # most settles one call reports from ``retired``
RETIRED_MAXLEN = 100_000  # approximate cap of ``retired``
# Put and lease tokens start with this many characters naming the instance that made them (a random hex id): a
# sample settled by the instance that put it is left off the ``retired`` feed (that instance scrubs it itself).
INSTANCE_CHARS = 16
# A reply remembered for a retry after a lost reply is kept this many seconds of the call's clock at least (and at
# least twice the calling instance's reconnect_timeout): the reaper's call drops it later (see ``calls_due``).
MEMO_SECONDS = 600
MAX_BATCH = 1000  # most items one batch call takes (the Lua unpacks a batch into one command's arguments)
# The ``pending`` gauge from the ``stats`` counters: each counter's sign (every ``pending`` entry is a put, a
# redelivery or a requeue; leases and dead letters take entries out). ``stats()`` and traced calls both derive it so.
PENDING_TERMS: dict[str, int] = {
    "put": 1, "failed": 1, "reclaimed": 1, "requeued": 1, "given_back": 1, "dead_lettered": -1, "leased": -1,
}  # fmt: skip

# The one definition of every constant the Lua uses: prepended to the prelude as ``local NAME = value``.
CONSTANTS: dict[str, str | int | dict[str, int]] = {
    "LAYOUT": LAYOUT,
    "REAP_LIMIT": REAP_LIMIT,
    "FEED_LIMIT": FEED_LIMIT,
    "RETIRED_MAXLEN": RETIRED_MAXLEN,
    "INSTANCE_CHARS": INSTANCE_CHARS,
    "MAX_BATCH": MAX_BATCH,
    "PENDING_TERMS": PENDING_TERMS,
}

# A ``done`` record's fields, in order: how the sample settled, the key and token of the lease that settled it
# (none for a reap) and the put token of the put it came from.
DONE_FIELDS = ("outcome", "key", "token", "put")

# The functions every reply of which is remembered for a retry after a lost reply: their first run leaves nothing a
# retry could recognise its effect by (a redelivery, a give-back, an extension, a requeue, a purge). The others
# remember theirs only when it reports what the client must act on or trace (see ``calls`` above).
REMEMBERED = frozenset({"fail", "lose", "reject", "give_back", "extend", "requeue", "purge"})

FUNCTIONS = (
    "init",
    "put",
    "put_many",
    "acquire",
    "ack",
    "fail",
    "lose",
    "reject",
    "give_back",
    "extend",
    "reclaim",
    "close",
    "requeue",
    "purge",
)


def _lua(name: str) -> str:
    """The text of package resource ``lua/<name>.lua``."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


def _literal(value: str | int | dict[str, int]) -> str:
    if isinstance(value, dict):  # a table of names (Lua identifiers) -> ints
        return "{" + ", ".join(f"{_name(name)} = {_literal(number)}" for name, number in value.items()) + "}"
    if isinstance(value, int):
        return str(value)
    return f"'{_name(value)}'"


def _name(value: str) -> str:
    if not value.replace("_", "").isalnum():
        raise ValueError(f"Lua string constants and table keys must be alphanumeric, got {value!r}")
    return value


def _record_codec(record: str, fields: tuple[str, ...]) -> str:
    """Lua ``<record>_record(t)`` (a table of the named ``fields`` as tab-separated text, in their order) and
    ``parse_<record>(text)`` (the table back; the last field may hold tabs): a pattern and a concatenation, about
    half what ``cjson`` costs on records every acquire and every settle write."""
    joined = " .. '\\t' .. ".join(f"t.{_name(field)}" for field in fields)
    pattern = "^" + "([^\\t]*)\\t" * (len(fields) - 1) + "(.*)$"
    names = ", ".join(fields)
    table = ", ".join(f"{field} = {field}" for field in fields)
    return (
        f"local function {record}_record(t)\n  return {joined}\nend\n"
        f"local function parse_{record}(text)\n  local {names} = string.match(text, '{pattern}')\n"
        f"  return {{{table}}}\nend\n"
    )


PRELUDE = (
    "".join(f"local {name} = {_literal(value)}\n" for name, value in CONSTANTS.items())
    + _record_codec("lease", LEASE_FIELDS)
    + _record_codec("done", DONE_FIELDS)
    + _lua("prelude")
    + _lua("prelude_calls")
)
SCRIPTS: dict[str, str] = {name: _lua(name) for name in FUNCTIONS}


class Library:
    """One Redis Functions library built from ``scripts`` (name -> Lua body run after the shared ``prelude``).

    ``source`` is what ``FUNCTION LOAD`` takes; ``function(name)`` the name ``FCALL`` takes. The tag is a
    hash of the source, so two different libraries (versions, or a test's seeded defect) coexist on a server.
    """

    def __init__(self, scripts: dict[str, str], prelude: str = PRELUDE) -> None:
        # Each body is a local function defined once, at load; its registered function begins the call, answers
        # a retry whose first run's reply was remembered with that reply, and remembers the body's reply.
        bodies = "".join(
            f"\nlocal function run_{name}(KEYS, ARGV)\n{body}end\n"
            f"redis.register_function('{{tag}}_{name}', function(KEYS, ARGV)\n"
            f"begin(KEYS, ARGV, {'true' if name in REMEMBERED else 'false'})\n"
            f"local again = recalled()\nif again then\n  return replay('{name}', again)\nend\n"
            f"return remember(run_{name}(KEYS, ARGV))\nend)\n"
            for name, body in scripts.items()
        )
        self.tag = "fs_" + hashlib.sha1((prelude + bodies).encode()).hexdigest()[:16]
        self.source = f"#!lua name={self.tag}\n{prelude}{bodies.replace('{tag}', self.tag)}"

    def function(self, name: str) -> str:
        """The ``FCALL`` name of script ``name``."""
        return f"{self.tag}_{name}"


LIBRARY = Library(SCRIPTS)
