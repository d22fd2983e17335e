"""Server-side Lua for ``RedisSampleRefQueue``: one Redis Functions library, every state change one atomic call.

Needs Redis 7.0+ (``FUNCTION LOAD`` / ``FCALL``). The library is loaded once per
server (and persisted with the dataset, AOF included); its helpers are compiled
and defined at load time, so a call pays only for its own commands. Function
names carry a hash of the source (``fs_<tag>_<script>``), so clients of
different versions never call each other's code.

Key layout (layout ``2``): ``KEYS[1]`` is the prefix ``featurestream:{name}:`` and
every key is the prefix plus one of these names (one ``{name}`` hash tag, so they
share a cluster slot; the functions derive the names rather than take twelve
KEYS, which would cost more to send than most calls cost to run):

1. ``stream``    deliveries (XADD ``s`` = sample id, ``n`` = redelivery count),
                 consumer group ``fs``; each delivery attempt is a new entry, so
                 a failed or reclaimed sample goes to the tail. Settled entries are
                 XACKed and trimmed in bulk (every ``TRIM_EVERY`` settles, and
                 whenever the queue holds nothing), not XDELed one by one.
2. ``refs``      hash sample id -> ``put token \\t ref JSON`` for every held
                 (pending or leased) sample; the put token makes a retried put idempotent.
3. ``leases``    hash lease key -> ``entry \\t token \\t n \\t put token \\t sample id`` (live leases).
4. ``deadlines`` zset lease key -> deadline (seconds); the reap index.
5. ``done``      hash sample id -> ``outcome \\t lease key \\t lease token \\t put token``:
                 the dedup window, also used to make retried ack/fail/put idempotent.
6. ``done_order`` list of sample ids in retirement order (evicts the window's oldest).
7. ``dead``      list of dead-letter JSON (``featurestream.backends.redis.wire`` schema).
8. ``meta``      hash: ``state`` (open/draining/drained), fixed config.
9. ``stats``     hash of the ``QueueStats`` counters. ``leased`` doubles as the lease id
                 sequence; the ``pending`` gauge is derived (put + failed + reclaimed
                 - dead_lettered - leased: every stream entry is a put or a redelivery).
10. ``wake``     stream a close or drain appends to, so blocked ``acquire`` calls wake.
11. ``retired``  stream of settled sample ids (capped): a producing instance reads
                 it to scrub, in its own store, the samples it put that another
                 process acked or dead-lettered (its residency counters would
                 otherwise never fall, and backpressure never resume).

Lease keys are the lease id zero-padded to 16 digits, so the deadline zset
orders ties by lease id exactly like the in-process queue's heap.

``ARGV[1]`` is a tab-separated header: ``now`` in seconds (empty: the server's
``TIME``, which every node agrees on), max_deliveries, dedup_window, the
caller's cursor in ``retired`` (empty: not wanted; ``$``: the caller holds no
unsettled puts, so just report the newest id) and ``1`` when the caller
traces; ``ARGV[2:]`` are per function. Every function except ``init`` and ``close`` first reaps
due leases, as every in-process queue operation does. Functions return
``{status, events, ...}`` where ``events`` is a flat list of
``kind, a, b`` triples the client turns into tracer calls, scrubs and
dead-letter callbacks. ``kind`` uses the lease/lifecycle machines' trigger
names (``lease``, ``extend``, ``ack``, ``fail``, ``reclaim``, ``close``,
``drain``) plus ``put``, ``dead``, ``dedup``, ``stale`` and ``retired`` (not traced).
"""

from __future__ import annotations

import hashlib

KEY_NAMES = (
    "stream",
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
)

GROUP = "fs"
LAYOUT = "2"
REAP_LIMIT = 1000

# Helpers, defined once when the library loads. Per-call state lives in these upvalues: a function call runs
# atomically, so no two calls ever see each other's values.
_PRELUDE = r"""
local GROUP = 'fs'
local REAP_LIMIT = 1000
local FEED_LIMIT = 1000
local RETIRED_MAXLEN = 100000
local TRIM_EVERY = 1000
-- Events only a tracer needs are sent when the caller traces; the client acts on the others.
local NEEDED = {dead = true, retired = true, drain = true}

local K_STREAM, K_REFS, K_LEASES, K_DEADLINES, K_DONE, K_DONE_ORDER, K_DEAD, K_META, K_STATS, K_WAKE, K_RETIRED
local now, MAX_DELIVERIES, DEDUP_WINDOW, CURSOR, TRACE, events

local function begin(keys, argv)
  local P = keys[1]
  K_STREAM, K_REFS, K_LEASES, K_DEADLINES = P .. 'stream', P .. 'refs', P .. 'leases', P .. 'deadlines'
  K_DONE, K_DONE_ORDER, K_DEAD, K_META = P .. 'done', P .. 'done_order', P .. 'dead', P .. 'meta'
  K_STATS, K_WAKE, K_RETIRED = P .. 'stats', P .. 'wake', P .. 'retired'
  local clock
  clock, MAX_DELIVERIES, DEDUP_WINDOW, CURSOR, TRACE = string.match(
    argv[1], '^([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)$')
  MAX_DELIVERIES, DEDUP_WINDOW, TRACE = tonumber(MAX_DELIVERIES), tonumber(DEDUP_WINDOW), TRACE == '1'
  if clock == '' then
    local t = redis.call('TIME')
    now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  else
    now = tonumber(clock)
  end
  events = {}
end

local function emit(kind, a, b)
  if TRACE or NEEDED[kind] then
    events[#events + 1] = kind
    events[#events + 1] = a
    events[#events + 1] = b
  end
end

local function fmt(x)
  return string.format('%.17g', x)
end

-- The put token and the ref JSON of a held sample's ``refs`` value.
local function split_held(value)
  local tab = string.find(value, '\t', 1, true)
  return string.sub(value, 1, tab - 1), string.sub(value, tab + 1)
end

-- Settles after the caller's cursor (exclusive), so a producing instance's store forgets the samples it put.
-- Only put and reclaim ask for it (their callers produce); a caller holding no unsettled puts sends '$' and
-- only learns the newest id (nothing before it can concern a sample it puts later).
local function feed()
  local cursor = CURSOR
  if cursor == '' then
    return
  end
  if cursor == '$' then
    local last = redis.call('XREVRANGE', K_RETIRED, '+', '-', 'COUNT', 1)
    emit('retired', '', last[1] and last[1][1] or '0-0')
    return
  end
  for _, entry in ipairs(redis.call('XRANGE', K_RETIRED, '(' .. cursor, '+', 'COUNT', FEED_LIMIT)) do
    emit('retired', entry[2][2], entry[1])
  end
end

-- entry, token, n, put token, sample id (the id goes last: it may contain tabs)
local function parse_lease(rec)
  return string.match(rec, '^([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$')
end

-- Drop settled stream entries in bulk: everything before the oldest one still pending or unread.
local function trim_stream()
  local oldest = redis.call('XPENDING', K_STREAM, GROUP)[2]
  if not oldest then
    for _, group in ipairs(redis.call('XINFO', 'GROUPS', K_STREAM)) do
      for i = 1, #group, 2 do
        if group[i] == 'last-delivered-id' then
          oldest = group[i + 1]
        end
      end
    end
  end
  redis.call('XTRIM', K_STREAM, 'MINID', oldest)
end

-- Called after a sample leaves ``refs``: an empty queue keeps no stream entries (all are settled), and a
-- closed one drains.
local function after_retire()
  if redis.call('HLEN', K_REFS) ~= 0 then
    return
  end
  redis.call('XTRIM', K_STREAM, 'MAXLEN', 0)
  if redis.call('HGET', K_META, 'state') == 'draining' then
    redis.call('HSET', K_META, 'state', 'drained')
    emit('drain', '', '')
    redis.call('XADD', K_WAKE, 'MAXLEN', '1', '*', 'wake', 'drain')
  end
end

local function retire(sid, outcome, key, token, put_token)
  redis.call('HDEL', K_REFS, sid)
  redis.call('XADD', K_RETIRED, 'MAXLEN', '~', RETIRED_MAXLEN, '*', 's', sid)
  if DEDUP_WINDOW > 0 then
    redis.call('HSET', K_DONE, sid, outcome .. '\t' .. key .. '\t' .. token .. '\t' .. put_token)
    if redis.call('RPUSH', K_DONE_ORDER, sid) > DEDUP_WINDOW then
      redis.call('HDEL', K_DONE, redis.call('LPOP', K_DONE_ORDER))
    end
  end
  after_retire()
end

local function redeliver(sid, n, reason, key, token, put_token)
  local deliveries = n + 1
  if deliveries >= MAX_DELIVERIES then
    local why = reason .. ' ' .. deliveries .. ' times (max_deliveries=' .. MAX_DELIVERIES .. ')'
    local _, ref = split_held(redis.call('HGET', K_REFS, sid))
    local letter = '{"ref":' .. ref .. ',"reason":"' .. why .. '","deliveries":' .. deliveries .. '}'
    redis.call('RPUSH', K_DEAD, letter)
    redis.call('HINCRBY', K_STATS, 'dead_lettered', 1)
    emit('dead', sid, letter)
    retire(sid, 'dead-lettered', key, token, put_token)
  else
    redis.call('XADD', K_STREAM, '*', 's', sid, 'n', deliveries)
  end
end

-- Remove a live lease and count its settle under ``counter``; every TRIM_EVERY settles, trim the stream.
local function drop_lease(key, entry, counter)
  redis.call('HDEL', K_LEASES, key)
  redis.call('ZREM', K_DEADLINES, key)
  redis.call('XACK', K_STREAM, GROUP, entry)
  if redis.call('HINCRBY', K_STATS, counter, 1) % TRIM_EVERY == 0 then
    trim_stream()
  end
end

local function reap()
  -- Most calls find nothing due: look at the earliest deadline before asking for the due range.
  local first = redis.call('ZRANGE', K_DEADLINES, 0, 0, 'WITHSCORES')
  if not first[2] or tonumber(first[2]) > now then
    return 0
  end
  local due = redis.call('ZRANGEBYSCORE', K_DEADLINES, '-inf', fmt(now), 'LIMIT', 0, REAP_LIMIT)
  for _, key in ipairs(due) do
    local entry, _, n, put_token, sid = parse_lease(redis.call('HGET', K_LEASES, key))
    drop_lease(key, entry, 'reclaimed')
    emit('reclaim', sid, key)
    -- no token in the dedup record: a late fail of this lease is stale, not a retry of a settle
    redeliver(sid, tonumber(n), 'expired', key, '', put_token)
  end
  return #due
end

-- the live lease record for (key, token), or nil when it is not live
local function live_lease(key, token)
  local rec = redis.call('HGET', K_LEASES, key)
  if not rec then
    return nil
  end
  local entry, tok, n, put_token, sid = parse_lease(rec)
  if tok ~= token or token == '' then
    return nil
  end
  return entry, tonumber(n), put_token, sid
end

local function settled_by(sid, outcome, key, token)
  local done = redis.call('HGET', K_DONE, sid)
  local prefix = outcome .. '\t' .. key .. '\t' .. token .. '\t'
  return token ~= '' and done and string.sub(done, 1, #prefix) == prefix
end

local function stale(op, key)
  redis.call('HINCRBY', K_STATS, 'stale_rejected', 1)
  emit('stale', op, key)
end
"""

INIT = r"""
redis.call('HSETNX', K_META, 'state', 'open')
redis.call('HSETNX', K_META, 'layout', '2')
redis.call('HSETNX', K_META, 'max_deliveries', MAX_DELIVERIES)
redis.call('HSETNX', K_META, 'dedup_window', DEDUP_WINDOW)
local ok, err = pcall(redis.call, 'XGROUP', 'CREATE', K_STREAM, GROUP, '$', 'MKSTREAM')
if not ok and not string.find(tostring(err), 'BUSYGROUP') then
  error(err)
end
local config = redis.call('HMGET', K_META, 'layout', 'max_deliveries', 'dedup_window')
local last = redis.call('XREVRANGE', K_RETIRED, '+', '-', 'COUNT', 1)
config[4] = last[1] and last[1][1] or '0-0'
return config
"""

PUT = r"""
feed()
reap()
local sid, ref, token = ARGV[2], ARGV[3], ARGV[4]
if redis.call('HGET', K_META, 'state') ~= 'open' then
  -- whether the id is queued all the same: then its retain belongs to that queued sample
  return {'closed', events, redis.call('HEXISTS', K_REFS, sid)}
end
local held = redis.call('HGET', K_REFS, sid)
if held then
  -- the same put retried after a lost reply is a success, any other put a duplicate
  if split_held(held) == token then
    return {'ok', events}
  end
  return {'held', events}
end
local done = redis.call('HGET', K_DONE, sid)
if done then
  local outcome, _, _, put_token = string.match(done, '^([^\t]*)\t([^\t]*)\t([^\t]*)\t(.*)$')
  if put_token == token then
    return {'ok', events}
  end
  redis.call('HINCRBY', K_STATS, 'dedup_refused', 1)
  emit('dedup', sid, '')
  return {'dedup', events, outcome}
end
redis.call('HSET', K_REFS, sid, token .. '\t' .. ref)
redis.call('XADD', K_STREAM, '*', 's', sid, 'n', '0')
redis.call('HINCRBY', K_STATS, 'put', 1)
emit('put', sid, '')
return {'ok', events}
"""

ACQUIRE = r"""
reap()
local vt, token = tonumber(ARGV[2]), ARGV[3]
while true do
  local got = redis.call('XREADGROUP', 'GROUP', GROUP, GROUP, 'COUNT', 1, 'STREAMS', K_STREAM, '>')
  if not got then
    break
  end
  local entry = got[1][2][1]
  local id, fields = entry[1], entry[2]
  local sid, n = fields[2], fields[4]
  local held = redis.call('HGET', K_REFS, sid)
  if held then
    local put_token, ref = split_held(held)
    local key = string.format('%016d', redis.call('HINCRBY', K_STATS, 'leased', 1))
    local deadline = now + vt
    redis.call('HSET', K_LEASES, key, id .. '\t' .. token .. '\t' .. n .. '\t' .. put_token .. '\t' .. sid)
    redis.call('ZADD', K_DEADLINES, fmt(deadline), key)
    emit('lease', sid, key)
    -- the client knows the deadline: its clock (or the now it sent) plus vt
    return {'ok', events, key, n, ref}
  end
  -- an entry whose sample is no longer held is never leased (defensive: no function leaves one; the pending
  -- gauge would count it)
  redis.call('XACK', K_STREAM, GROUP, id)
end
if redis.call('HGET', K_META, 'state') == 'drained' then
  return {'drained', events}
end
-- nothing to lease: tell the client where to block (XREAD after these ids) and for how long at most
local last = redis.call('XREVRANGE', K_STREAM, '+', '-', 'COUNT', 1)
local wake = redis.call('XREVRANGE', K_WAKE, '+', '-', 'COUNT', 1)
local first = redis.call('ZRANGE', K_DEADLINES, 0, 0, 'WITHSCORES')
local until_deadline = ''
if first[2] then
  until_deadline = fmt(tonumber(first[2]) - now)
end
return {'empty', events, last[1] and last[1][1] or '0-0', wake[1] and wake[1][1] or '0-0', until_deadline}
"""

ACK = r"""
reap()
local key, token, sid = ARGV[2], ARGV[3], ARGV[4]
local entry, n, put_token, live_sid = live_lease(key, token)
if entry then
  drop_lease(key, entry, 'acked')
  emit('ack', live_sid, key)
  retire(live_sid, 'acked', key, token, put_token)
  return {'ok', events}
end
-- this very lease already acked (a retry after a lost reply): the caller still has to scrub
if settled_by(sid, 'acked', key, token) then
  return {'again', events}
end
stale('ack', key)
return {'stale', events}
"""

FAIL = r"""
reap()
local key, token, sid = ARGV[2], ARGV[3], ARGV[4]
local entry, n, put_token, live_sid = live_lease(key, token)
if entry then
  drop_lease(key, entry, 'failed')
  emit('fail', live_sid, key)
  redeliver(live_sid, n, 'failed', key, token, put_token)
  return {'ok', events}
end
if settled_by(sid, 'dead-lettered', key, token) then
  return {'again', events}
end
stale('fail', key)
return {'stale', events}
"""

EXTEND = r"""
reap()
local key, token, extra = ARGV[2], ARGV[3], tonumber(ARGV[4])
local entry, n, put_token, sid = live_lease(key, token)
if entry then
  local deadline = now + extra
  redis.call('ZADD', K_DEADLINES, fmt(deadline), key)
  redis.call('HINCRBY', K_STATS, 'extended', 1)
  emit('extend', sid, key)
  return {'ok', events, fmt(deadline), fmt(now)}
end
stale('extend', key)
return {'lost', events}
"""

RECLAIM = r"""
feed()
local count = reap()
return {'ok', events, count, redis.call('HGET', K_META, 'state')}
"""

CLOSE = r"""
if redis.call('HGET', K_META, 'state') == 'open' then
  redis.call('HSET', K_META, 'state', 'draining')
  emit('close', '', '')
  after_retire()
  redis.call('XADD', K_WAKE, 'MAXLEN', '1', '*', 'wake', 'close')
end
return {'ok', events}
"""

SCRIPTS = {
    "init": INIT,
    "put": PUT,
    "acquire": ACQUIRE,
    "ack": ACK,
    "fail": FAIL,
    "extend": EXTEND,
    "reclaim": RECLAIM,
    "close": CLOSE,
}


class Library:
    """One Redis Functions library built from ``scripts`` (name -> Lua body run after the shared prelude).

    ``source`` is what ``FUNCTION LOAD`` takes; ``function(name)`` the name ``FCALL`` takes. The tag is a
    hash of the source, so two different libraries (versions, or a test's seeded defect) coexist on a server.
    """

    def __init__(self, scripts: dict[str, str]) -> None:
        bodies = "".join(
            f"\nredis.register_function('{{tag}}_{name}', function(KEYS, ARGV)\nbegin(KEYS, ARGV)\n{body}end)\n"
            for name, body in scripts.items()
        )
        self.tag = "fs_" + hashlib.sha1((_PRELUDE + bodies).encode()).hexdigest()[:16]
        self.source = f"#!lua name={self.tag}\n{_PRELUDE}{bodies.replace('{tag}', self.tag)}"

    def function(self, name: str) -> str:
        """The ``FCALL`` name of script ``name``."""
        return f"{self.tag}_{name}"


LIBRARY = Library(SCRIPTS)
