-- The second half of the prelude (functions.PRELUDE appends it to lua/prelude.lua, in the same chunk, so the
-- helpers and per-call state defined there are in scope): what the put, acquire, settle and dead-letter functions
-- share.

-- Why a put with put token ``token`` cannot add a sample whose ``refs`` and ``done`` values are ``held`` and
-- ``done`` (false when absent): nil (it can), 'again' (this very put took effect already: a retry after a lost
-- reply), 'held' (queued by another put), 'dedup' and the outcome, or 'kept' (a dead letter whose bytes are
-- kept for a requeue, after the dedup window forgot it: its bytes are not the put's to enqueue).
local function put_verdict(sid, held, done, token)
  if held then
    if split_held(held) == token then
      return 'again'
    end
    return 'held'
  end
  if done then
    local settled = parse_done(done)
    if settled.put == token then
      return 'again'
    end
    return 'dedup', settled.outcome
  end
  read_meta()
  if KEEP_BYTES > 0 and redis.call('HEXISTS', K_KEPT, sid) == 1 then
    return 'kept'
  end
  return nil
end

-- A put refused by the dedup window: remembered, so a retry after a lost reply counts it no second time (a
-- refusal changes nothing else to recognise it by).
local function refuse_dedup(sid)
  redis.call('HINCRBY', K_STATS, 'dedup_refused', '1')
  REMEMBER_REPLY = true
  emit('dedup', sid, '')
end

-- Enqueue new samples: ``fresh`` is a list of {sample id, ref JSON, put token}, in order.
local function put_new(fresh)
  local refs, entries = {}, {}
  for i, item in ipairs(fresh) do
    refs[2 * i - 1] = item[1]
    refs[2 * i] = item[3] .. '\t' .. item[2]
    entries[i] = '0\t' .. item[1]
  end
  redis.call('HSET', K_REFS, unpack(refs))
  enqueue(entries)
  for _, item in ipairs(fresh) do
    emit('put', item[1], '', '0', 1)
  end
  redis.call('HINCRBY', K_STATS, 'put', count_arg(#fresh))
end

-- Lease up to ``count`` entries to the caller; lease i gets token ``base .. i``. Appends
-- ``key, n, ref JSON`` per lease to ``reply``; returns how many. One command of each kind per batch.
local function lease_entries(count, vt, base, reply)
  local leased = 0
  while leased < count do
    local got = redis.call('LPOP', K_PENDING, count_arg(count - leased))
    if not got then
      break
    end
    local sids, ns = {}, {}
    for _, entry in ipairs(got) do
      local n, sid = string.match(entry, '^(%d+)\t(.+)$')
      if n then
        ns[#ns + 1], sids[#sids + 1] = n, sid
      else
        -- written by something other than these functions: moved aside once (raw, as a dead letter of reason
        -- 'malformed') and reported, so the client logs it; never leased, never an error to a consumer
        redis.call('RPUSH', K_MALFORMED, 'malformed\t' .. entry)
        emit('malformed', '', entry)
      end
    end
    local held = #sids > 0 and redis.call('HMGET', K_REFS, unpack(sids)) or {}
    local taken = {}
    for i = 1, #sids do
      -- an entry whose sample is no longer held is dropped, never leased (defensive: no function leaves one;
      -- the pending gauge would count it)
      if held[i] then
        taken[#taken + 1] = i
      end
    end
    if #taken > 0 then
      local last = redis.call('HINCRBY', K_STATS, 'leased', count_arg(#taken))
      local issued = fmt(server_now())
      local deadline = fmt(clock() + vt)
      local records, scores = {}, {}
      for j, i in ipairs(taken) do
        local sid, n = sids[i], ns[i]
        local put_token, ref = split_held(held[i])
        local key = string.format('%016d', last - #taken + j)
        records[2 * j - 1] = key
        records[2 * j] = lease_record({issued = issued, token = base .. count_arg(leased + j), n = n, put = put_token,
          sample = sid})
        scores[2 * j - 1] = deadline
        scores[2 * j] = key
        emit('lease', sid, key, n, -1, 1, deadline)
        -- the client knows the deadline: its clock (or the now it sent) plus vt
        reply[#reply + 1] = key
        reply[#reply + 1] = n
        reply[#reply + 1] = ref
      end
      redis.call('HSET', K_LEASES, unpack(records))
      redis.call('ZADD', K_DEADLINES, unpack(scores))
      leased = leased + #taken
    end
  end
  return leased
end

-- Nothing to lease: where the client should block (XREAD on ``wake`` after this id) and for how long at most.
-- A caller that will block for ``wait`` seconds is registered as waiting until then (server time), so that the
-- calls that make a sample pending wake it (wake_waiters).
local function empty_reply(wait)
  if read_meta() == 'drained' then
    return {'drained', events}
  end
  if wait > 0 then
    local until_ = server_now() + wait
    if until_ > WAITING then
      redis.call('HSET', K_META, 'waiting', fmt(until_))
    end
  end
  local wake = redis.call('XREVRANGE', K_WAKE, '+', '-', 'COUNT', '1')
  local first = redis.call('ZRANGE', K_DEADLINES, '0', '0', 'WITHSCORES')
  local until_deadline = ''
  if first[2] then
    until_deadline = fmt(tonumber(first[2]) - clock())
  end
  return {'empty', events, wake[1] and wake[1][1] or '0-0', until_deadline}
end

-- the live lease record for (key, token), or nil when it is not live
local function live_lease(key, token)
  local rec = redis.call('HGET', K_LEASES, key)
  if not rec then
    return nil
  end
  local lease = parse_lease(rec)
  if lease.token ~= token or token == '' then
    return nil
  end
  return true, tonumber(lease.n), lease.put, lease.sample
end

-- whether the lease (key, token) was settled with ``outcome`` already (a retry after a lost reply)
local function settled_by(sid, outcome, key, token)
  local done = token ~= '' and redis.call('HGET', K_DONE, sid)
  if not done then
    return false
  end
  local settled = parse_done(done)
  return settled.outcome == outcome and settled.key == key and settled.token == token
end

-- A retried put that took effect already (put_verdict said 'again'): 0 while its sample is still queued
-- (``held``), else it settled since -- 1, or 2 when it is a dead letter whose bytes are kept. The settle went on
-- the ``retired`` feed before the putter knew the sample was its own, so the reply tells it instead.
local function settled_since(sid, held)
  if held then
    return 0
  end
  return redis.call('HEXISTS', K_KEPT, sid) == 1 and 2 or 1
end

-- A rejected ack/fail/extend; ``live``: the lease key is live, so the caller presented a copy of it (forged).
-- Remembered, so a retry after a lost reply counts it no second time.
local function stale(op, key, live)
  redis.call('HINCRBY', K_STATS, 'stale_rejected', '1')
  REMEMBER_REPLY = true
  emit(live and 'forged' or 'stale', op, key)
end

-- The stale leases of a batch that came before one of its live ones: {key = lease key, live = held} each.
local function stale_each(op, before)
  for _, item in ipairs(before) do
    stale(op, item.key, item.live)
  end
end

-- Settle a batch of leases, ARGV[first:] (``first`` default 2) = (lease key, token, sample id) per lease, each on
-- its own: 'ok', 'again'
-- (this very lease settled so already: a retry after a lost reply whose reply was not remembered), or 'stale'.
-- The live ones are dropped together (``counter``); ``settle(live)`` finishes them, ``live`` being a list of
-- {sample, key, token, n (the redelivery count, text), put (the put token), before (the stale leases just before
-- it)}: each live lease's settle first rejects those, so the events follow the batch's order item by item, as
-- the calls one at a time would. Returns the statuses, in order.
local function settle_batch(op, counter, outcome, settle, first)
  first = first or 2
  local keys = {}
  for i = first, #ARGS, 3 do
    keys[#keys + 1] = ARGS[i]
  end
  local records = redis.call('HMGET', K_LEASES, unpack(keys))
  local statuses, live, live_keys, before = {}, {}, {}, {}
  for j, key in ipairs(keys) do
    local token, sid = ARGS[first + 3 * j - 2], ARGS[first + 3 * j - 1]
    local lease = records[j] and parse_lease(records[j])
    -- the client sends each lease of a batch once with its token (a repeated one without), so keys differ
    if lease and token ~= '' and lease.token == token then
      statuses[j] = 'ok'
      live[#live + 1] = {sample = lease.sample, key = key, token = token, n = lease.n, put = lease.put, before = before}
      before = {}
      live_keys[#live_keys + 1] = key
    elseif settled_by(sid, outcome, key, token) then
      statuses[j] = 'again'
    else
      before[#before + 1] = {key = key, live = records[j] ~= false}
      statuses[j] = 'stale'
    end
  end
  if #live > 0 then
    drop_leases(live_keys, counter)
    settle(live)
  end
  stale_each(op, before)
  return statuses
end

local function ack_live(live)
  for _, lease in ipairs(live) do
    stale_each('ack', lease.before)
    emit('ack', lease.sample, lease.key, lease.n, 0, -1)
  end
  retire(live, 'acked')
end

-- ``verdict``: why no redelivery could serve the samples (see redeliver).
local function fail_live(live, verdict)
  for _, lease in ipairs(live) do
    stale_each('fail', lease.before)
    redeliver('fail', lease.sample, lease.n, lease.key, lease.token, lease.put, nil, verdict)
  end
end

local LOST = {reason = LOST_REASON, keepable = false}

local function lose_live(live)
  fail_live(live, LOST)
end

-- No consumer can train the samples: ARGS[2] is the dead letters' reason.
local function reject_live(live)
  fail_live(live, {reason = ARGS[2], keepable = true})
end

-- Unused leases handed back: to the tail with their redelivery count (the lease record's ``n``) unchanged.
local function give_back_live(live)
  local entries = {}
  for i, lease in ipairs(live) do
    stale_each('give_back', lease.before)
    entries[i] = lease.n .. '\t' .. lease.sample
    emit('give_back', lease.sample, lease.key, lease.n, 1, -1)
  end
  enqueue(entries)
end

-- The dead letters ARGS[first:] name (all of them when none is named), as positions in ``letters``, in the
-- list's order; nil and the first unknown id when one names no dead letter. ``sids[i]`` is letter i's id.
local function chosen_letters(letters, first)
  local sids, position = {}, {}
  for i, letter in ipairs(letters) do
    sids[i] = cjson.decode(letter).sample
    position[sids[i]] = position[sids[i]] or i
  end
  local chosen = {}
  if #ARGS < first then
    for i = 1, #letters do
      chosen[i] = true
    end
  else
    for j = first, #ARGS do
      local at = position[ARGS[j]]
      if not at then
        return nil, ARGS[j], sids
      end
      chosen[at] = true
    end
  end
  return chosen, nil, sids
end

-- The ref JSON of a dead letter.
local function letter_ref(letter)
  return cjson.decode(letter).ref
end

-- Rewrite the dead-letter list without the chosen ones.
local function keep_letters(letters, chosen)
  local rest = {}
  for i, letter in ipairs(letters) do
    if not chosen[i] then
      rest[#rest + 1] = letter
    end
  end
  redis.call('DEL', K_DEAD)
  if #rest > 0 then
    redis.call('RPUSH', K_DEAD, unpack(rest))
  end
end

-- A kept dead letter leaves the kept set (requeued or purged); returns whether it was kept.
local function unkeep(sid)
  local size = redis.call('HGET', K_KEPT, sid)
  if not size then
    return false
  end
  redis.call('HDEL', K_KEPT, sid)
  redis.call('HINCRBY', K_META, 'kept_bytes', -tonumber(size))
  return true
end

-- What a remembered reply tells afresh when sent again to its call's retry, by function: a put's sample may have
-- settled since (settled_since; a sample of that id queued by another put is not this put's), and an extend's
-- deadline is read against this run's clock.
local REPLAY = {}

function REPLAY.put(reply)
  if reply[1] == 'ok' then
    local held = redis.call('HGET', K_REFS, ARGS[2])
    reply[3] = settled_since(ARGS[2], held and split_held(held) == ARGS[4])
  end
end

function REPLAY.put_many(reply)
  if reply[1] == 'ok' then
    local sids, settled, any_settled = {}, {}, false
    for i = 3, #ARGS, 2 do
      sids[#sids + 1] = ARGS[i]
    end
    local held = redis.call('HMGET', K_REFS, unpack(sids))
    for j, sid in ipairs(sids) do
      settled[j] = settled_since(sid, held[j] and split_held(held[j]) == ARGS[2] .. j)
      any_settled = any_settled or settled[j] ~= 0
    end
    reply[3] = any_settled and settled or nil
  end
end

function REPLAY.extend(reply)
  if reply[1] == 'ok' then
    reply[4] = fmt(clock())
  end
end

-- The first run's reply (see recalled), as function ``name`` sends it again.
local function replay(name, reply)
  local tell = REPLAY[name]
  if tell then
    tell(reply)
  end
  return reply
end
