-- Helpers shared by every function of the library, defined once when it loads. The constants (LAYOUT,
-- REAP_LIMIT, ...) are prepended by featurestream.backends.redis.functions, their one definition, and so is the
-- codec of the ``leases`` and ``done`` records, generated from their fields (featurestream.backends.redis.wire's
-- LEASE_FIELDS, functions.DONE_FIELDS): lease_record(lease) writes a table of those named fields as a record,
-- parse_lease(record) reads one back; done_record and parse_done likewise.
-- Per-call state lives in these upvalues: a function call runs atomically, so no two calls see each other's.

-- Events only a tracer needs are sent when the caller traces; the client acts on the others (a reclaim moves
-- the lease machine it runs for that lease; leases, settles and extends it learns from the statuses).
local CLIENT_EVENTS = {dead = true, kept = true, retired = true, drain = true, reclaim = true, malformed = true}

-- Counts as command arguments, formatted once: Lua formats a number argument with sprintf on every call.
local COUNTS = {}
for i = 0, MAX_BATCH do
  COUNTS[i] = i .. ''
end

-- ``n`` as a command argument (a string: the same command, without a sprintf per call for the common counts).
local function count_arg(n)
  return COUNTS[n] or n
end

local K_PENDING, K_REFS, K_LEASES, K_DEADLINES, K_DONE, K_DONE_ORDER, K_DEAD, K_META, K_STATS, K_WAKE, K_RETIRED
local K_KEPT, K_CALLS, K_CALLS_DUE, K_MALFORMED, PREFIX
local ARGS, CLOCK, now, MAX_DELIVERIES, DEDUP_WINDOW, CURSOR, TRACE, events
-- This call's read of ``meta`` (read_meta): the lifecycle state, until when (server seconds) a consumer may be
-- blocked waiting for a delivery, and keep_dead_letter_bytes. ``woken``: this call woke the waiters already.
local STATE, WAITING, KEEP_BYTES, woken
-- The header's last field: '+' when the request may repeat one this server ran (else '-'), the call's id (its
-- client's instance id, INSTANCE_CHARS characters, then a counter), ':' and how long (seconds of the call's
-- clock) a reply remembered for a retry is kept. Read only by a call that remembers or recalls.
local CALL_ID
-- Whether this call's reply is remembered for its retry: it reports something the client must act on or trace
-- (see emit), changes what a retry could not recognise, or counts a refusal.
local REMEMBER_REPLY
-- Traced calls only: the queue's pending and leased counts as this call's events so far left them (see emit).
local traced_pending, traced_leased
-- the header's settings as text, and their numbers: parsed again only when a call sends other text
local SETTINGS_TEXT

-- The pending and leased counts as a traced call begins: read once, then each event applies its own change.
-- Pending is derived from the counters as stats() derives it (PENDING_TERMS: counter -> sign).
local function read_counts()
  local fields, signs = {}, {}
  for name, sign in pairs(PENDING_TERMS) do
    fields[#fields + 1] = name
    signs[#signs + 1] = sign
  end
  traced_pending = 0
  for i, value in ipairs(redis.call('HMGET', K_STATS, unpack(fields))) do
    traced_pending = traced_pending + signs[i] * (tonumber(value) or 0)
  end
  traced_leased = redis.call('HLEN', K_LEASES)
end

-- ``remembers``: the function's every reply is remembered (its effects leave nothing a retry could recognise).
local function begin(keys, argv, remembers)
  local P = keys[1]
  ARGS = argv
  -- the key names of the last queue called stay valid (one queue's calls usually follow each other)
  if P ~= PREFIX then
    K_PENDING, K_REFS, K_LEASES, K_DEADLINES = P .. 'pending', P .. 'refs', P .. 'leases', P .. 'deadlines'
    K_DONE, K_DONE_ORDER, K_DEAD, K_META = P .. 'done', P .. 'done_order', P .. 'dead', P .. 'meta'
    K_STATS, K_WAKE, K_RETIRED, K_KEPT = P .. 'stats', P .. 'wake', P .. 'retired', P .. 'kept'
    K_CALLS, K_CALLS_DUE, K_MALFORMED = P .. 'calls', P .. 'calls_due', P .. 'malformed'
    PREFIX = P
  end
  local settings, max_deliveries, dedup_window
  CLOCK, settings, max_deliveries, dedup_window, CURSOR, TRACE, CALL_ID = string.match(
    argv[1], '^([^\t]*)\t(([^\t]*)\t([^\t]*))\t([^\t]*)\t([^\t]*)\t([^\t]*)$')
  if settings ~= SETTINGS_TEXT or not settings then
    SETTINGS_TEXT, MAX_DELIVERIES, DEDUP_WINDOW = settings, tonumber(max_deliveries), tonumber(dedup_window)
  end
  TRACE = TRACE == '1'
  REMEMBER_REPLY = remembers
  now = nil
  STATE = nil
  woken = false
  events = {}
  if TRACE then
    read_counts()
  end
end

-- This call's time in seconds: the caller's clock, or the server's TIME (read once, and only when needed:
-- most puts and acks find no lease due without it).
local function clock()
  if not now then
    if CLOCK == '' then
      local t = redis.call('TIME')
      now = tonumber(t[1]) + tonumber(t[2]) / 1000000
    else
      now = tonumber(CLOCK)
    end
  end
  return now
end

-- The server's TIME in seconds, whatever clock the caller sent: consumers block (XREAD BLOCK) in real time.
local function server_now()
  if CLOCK == '' then
    return clock()
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

-- Read ``meta``'s state, waiting and keep_bytes once per call (one command for the three).
local function read_meta()
  if not STATE then
    local meta = redis.call('HMGET', K_META, 'state', 'waiting', 'keep_bytes')
    STATE, WAITING, KEEP_BYTES = meta[1], tonumber(meta[2] or '0'), tonumber(meta[3] or '0')
  end
  return STATE
end

local function set_state(state)
  redis.call('HSET', K_META, 'state', state)
  STATE = state
end

local function is_open()
  return read_meta() == 'open'
end

-- A sample became pending: wake the consumers blocked waiting for one (once per call). A consumer that found
-- nothing to lease registered its wait in ``meta`` ``waiting`` (see empty_reply); with none waiting, a put
-- costs no write to ``wake``.
local function wake_waiters()
  if woken then
    return
  end
  woken = true
  read_meta()
  if WAITING > 0 and WAITING >= server_now() then
    redis.call('XADD', K_WAKE, 'MAXLEN', '1', '*', 'wake', 'pending')
  end
end

-- Append pending deliveries (``n \t sample id`` each) at the tail and wake the waiting consumers.
local function enqueue(entries)
  redis.call('RPUSH', K_PENDING, unpack(entries))
  wake_waiters()
end

local function fmt(x)
  return string.format('%.17g', x)
end

-- The state a traced event left, a record with named fields (decoded by featurestream.backends.redis.wire's
-- event_state): ``n`` (the lease's redelivery count), the pending and ``outstanding`` (leased) counts, the call's
-- clock ``now`` and ``deadline`` (a lease's); '' where none. Times as text: cjson would round them to 14 digits.
local function traced_state(n, deadline)
  return cjson.encode({
    n = n or '', pending = traced_pending, outstanding = traced_leased, now = fmt(clock()), deadline = deadline or ''})
end

-- Report event ``kind`` (arguments ``a``, ``b``) to the client. A traced call's events also carry the state they
-- left (traced_state), computed here, atomically with the change: the pending and leased counts after the event's
-- own changes ``pending_change`` and ``leased_change``, so each event of a batch reports the state its item left,
-- as one call per item would. A call that reports an event other than a settle of the feed is remembered for its
-- retry (see remember): the client acts on it (a scrub, a dead-letter callback, the lease machine) or traces it.
local function emit(kind, a, b, n, pending_change, leased_change, deadline)
  if TRACE then
    traced_pending = traced_pending + (pending_change or 0)
    traced_leased = traced_leased + (leased_change or 0)
    events[#events + 1] = kind
    events[#events + 1] = a
    events[#events + 1] = b
    events[#events + 1] = traced_state(n, deadline)
  elseif CLIENT_EVENTS[kind] then
    events[#events + 1] = kind
    events[#events + 1] = a
    events[#events + 1] = b
  else
    return
  end
  if kind ~= 'retired' then
    REMEMBER_REPLY = true
  end
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
    local last = redis.call('XREVRANGE', K_RETIRED, '+', '-', 'COUNT', '1')
    emit('retired', '', last[1] and last[1][1] or '0-0')
    return
  end
  -- an entry holds the ids of one call's settles: s, id, s, id ...
  for _, entry in ipairs(redis.call('XRANGE', K_RETIRED, '(' .. cursor, '+', 'COUNT', count_arg(FEED_LIMIT))) do
    local fields = entry[2]
    for j = 2, #fields, 2 do
      emit('retired', fields[j], entry[1])
    end
  end
end

-- Called after a sample leaves ``refs``: a closed queue that holds nothing drains.
local function after_retire()
  if redis.call('HLEN', K_REFS) ~= 0 then
    return
  end
  if read_meta() == 'draining' then
    set_state('drained')
    emit('drain', '', '')
    redis.call('XADD', K_WAKE, 'MAXLEN', '1', '*', 'wake', 'drain')
  end
end

-- Report settled (or purged) sample ids on the ``retired`` feed, so their producers' stores scrub them.
local function publish(sids)
  local fed = {}
  for i, sid in ipairs(sids) do
    fed[2 * i - 1] = 's'
    fed[2 * i] = sid
  end
  redis.call('XADD', K_RETIRED, 'MAXLEN', '~', RETIRED_MAXLEN, '*', unpack(fed))
end

-- Whether the instance that put a sample (put token ``put_token``) settles it itself, with its lease token
-- ``token``: tokens start with the instance's INSTANCE_CHARS-character id. That instance scrubs the sample on
-- the reply (or on its retry after a lost reply), so the ``retired`` feed need not tell it.
local function own_settle(token, put_token)
  return token ~= '' and string.sub(token, 1, INSTANCE_CHARS) == string.sub(put_token, 1, INSTANCE_CHARS)
end

-- Settle samples for good: ``items`` are {sample, key (the lease's), token (the lease's), put (the put token)}.
-- One command of each kind for the whole batch: the held refs go, one ``retired`` entry reports the ones another
-- instance put (unless their bytes are ``kept``: a dead letter kept for requeue), the dedup window records them.
local function retire(items, outcome, kept)
  local sids, done, fed = {}, {}, {}
  for i, item in ipairs(items) do
    sids[i] = item.sample
    done[2 * i - 1] = item.sample
    done[2 * i] = done_record({outcome = outcome, key = item.key, token = item.token, put = item.put})
    if not own_settle(item.token, item.put) then
      fed[#fed + 1] = item.sample
    end
  end
  redis.call('HDEL', K_REFS, unpack(sids))
  if not kept and #fed > 0 then
    publish(fed)
  end
  if DEDUP_WINDOW > 0 then
    redis.call('HSET', K_DONE, unpack(done))
    local over = redis.call('RPUSH', K_DONE_ORDER, unpack(sids)) - DEDUP_WINDOW
    if over > 0 then
      redis.call('HDEL', K_DONE, unpack(redis.call('LPOP', K_DONE_ORDER, count_arg(over))))
    end
  end
  after_retire()
end

local REASONS = {fail = 'failed', reclaim = 'expired'}
local LOST_REASON = 'lost: the store lost its bytes (it was never scrubbed); no redelivery could serve it'

-- A ``dead`` entry: a record with named fields, the dead-letter wire format of featurestream.backends.redis.wire
-- (dead_letter_to_json / dead_letter_from_json): ``sample`` (the id), ``ref`` (the ref JSON, as text),
-- ``reason`` and ``deliveries``.
local function dead_letter(sid, ref, reason, deliveries)
  return cjson.encode({sample = sid, ref = ref, reason = reason, deliveries = deliveries})
end

-- Finish the fail or reclaim (event ``kind``) of lease ``key`` of sample ``sid``: the sample goes to the tail as
-- a new entry, or is dead once its deliveries are spent. ``n``: the lease's redelivery count, as its lease record
-- holds it (text); ``deadline``: a reclaimed lease's (traced). ``verdict``: a fail no redelivery could serve,
-- {reason = the dead letter's, keepable = whether its bytes may be kept}: dead at once, whatever deliveries are
-- left (the store lost the sample's bytes: nothing to keep; no consumer can train it: kept as any dead letter).
local function redeliver(kind, sid, n, key, token, put_token, deadline, verdict)
  local deliveries = tonumber(n) + 1
  if deliveries >= MAX_DELIVERIES or verdict then
    local why = verdict and verdict.reason
      or REASONS[kind] .. ' ' .. deliveries .. ' times (max_deliveries=' .. MAX_DELIVERIES .. ')'
    local _, ref = split_held(redis.call('HGET', K_REFS, sid))
    local letter = dead_letter(sid, ref, why, deliveries)
    redis.call('RPUSH', K_DEAD, letter)
    redis.call('HINCRBY', K_STATS, 'dead_lettered', '1')
    -- keep_dead_letter_bytes: the sample stays retained (for a requeue) while the kept bytes fit the cap
    read_meta()
    local cap = KEEP_BYTES
    local size = tonumber(string.match(ref, '"estimated_bytes":(%d+)'))
    local kept = (not verdict or verdict.keepable) and cap > 0 and tonumber(redis.call('HGET', K_META, 'kept_bytes') or '0') + size <= cap
    if kept then
      redis.call('HSET', K_KEPT, sid, size)
      redis.call('HINCRBY', K_META, 'kept_bytes', size)
    end
    emit(kind, sid, key, n, 0, -1, deadline)
    emit(kept and 'kept' or 'dead', sid, letter, n)
    retire({{sample = sid, key = key, token = token, put = put_token}}, 'dead-lettered', kept)
  else
    enqueue({deliveries .. '\t' .. sid})
    emit(kind, sid, key, n, 1, -1, deadline)
  end
end

-- Remove live leases and count their settles under ``counter``.
local function drop_leases(keys, counter)
  redis.call('HDEL', K_LEASES, unpack(keys))
  redis.call('ZREM', K_DEADLINES, unpack(keys))
  redis.call('HINCRBY', K_STATS, counter, count_arg(#keys))
end

local function reap()
  -- Most calls find nothing due: look at the earliest deadline before asking for the due range.
  local first = redis.call('ZRANGE', K_DEADLINES, '0', '0', 'WITHSCORES')
  if not first[2] or tonumber(first[2]) > clock() then
    return 0
  end
  local due = redis.call(
    'ZRANGEBYSCORE', K_DEADLINES, '-inf', fmt(clock()), 'WITHSCORES', 'LIMIT', '0', count_arg(REAP_LIMIT))
  for i = 1, #due, 2 do
    local key = due[i]
    local lease = parse_lease(redis.call('HGET', K_LEASES, key))
    drop_leases({key}, 'reclaimed')
    -- no token in the dedup record: a late fail of this lease is stale, not a retry of a settle
    redeliver('reclaim', lease.sample, lease.n, key, '', lease.put, due[i + 1])
  end
  return #due / 2
end

-- When this call is the retry of one whose reply was lost and that reply was remembered: that reply, as it was
-- sent, else nil. ``calls`` holds each instance's last remembered call id and reply, one field per instance (an
-- instance's calls are serial, so a retry always follows the call it repeats); only a retry looks.
local function recalled()
  if string.byte(CALL_ID, 1) ~= 43 then  -- '+'
    return nil
  end
  local id = string.sub(CALL_ID, 2)
  local memo = redis.call('HGET', K_CALLS, string.sub(id, 1, INSTANCE_CHARS))
  if memo and string.sub(memo, 1, #id + 1) == id .. '\t' then
    return cjson.decode(string.sub(memo, #id + 2))
  end
  return nil
end

-- The end of every call: its reply, remembered for its retry when REMEMBER_REPLY says so (the reply reports events
-- the client acts on or traces, a refusal it counted, or an effect a retry could not recognise). Kept until the
-- instance disconnects, its next remembered call replaces it, or its keep time (see CALL_ID) has passed
-- (``calls_due``: instance -> when; see prune_calls).
local function remember(reply)
  if REMEMBER_REPLY then
    local id = string.sub(CALL_ID, 2)
    local instance = string.sub(id, 1, INSTANCE_CHARS)
    redis.call('HSET', K_CALLS, instance, id .. '\t' .. cjson.encode(reply))
    redis.call('ZADD', K_CALLS_DUE, fmt(clock() + tonumber(string.match(id, ':(.*)$'))), instance)
  end
  return reply
end

-- Drop the remembered replies whose time is up (at most REAP_LIMIT of them): no retry can come that late.
local function prune_calls()
  local due = redis.call('ZRANGEBYSCORE', K_CALLS_DUE, '-inf', fmt(clock()), 'LIMIT', '0', count_arg(REAP_LIMIT))
  if #due > 0 then
    redis.call('HDEL', K_CALLS, unpack(due))
    redis.call('ZREM', K_CALLS_DUE, unpack(due))
  end
end
