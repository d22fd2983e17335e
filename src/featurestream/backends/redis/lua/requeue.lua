-- ARGV: base put token, then the sample ids (none: every dead letter). All or nothing: refused (changing
-- nothing) when an id names no dead letter, a letter's bytes were not kept, the id is queued again, or the
-- queue is drained. Each requeued sample goes to the tail with a fresh delivery budget (n = 0), leaves the
-- dead letters and the dedup window (it was never acked), and counts under ``requeued``.
local state = read_meta()
local letters = redis.call('LRANGE', K_DEAD, 0, -1)
local chosen, unknown, sids = chosen_letters(letters, 3)
if not chosen then
  return {'unknown', events, unknown}
end
if state == 'drained' then
  return {'drained', events, ''}
end
for i = 1, #letters do
  if chosen[i] then
    if redis.call('HEXISTS', K_KEPT, sids[i]) == 0 then
      return {'gone', events, sids[i]}
    end
    if redis.call('HEXISTS', K_REFS, sids[i]) == 1 then
      return {'held', events, sids[i]}
    end
  end
end
local requeued = {}
for i, letter in ipairs(letters) do
  if chosen[i] then
    local sid = sids[i]
    unkeep(sid)
    redis.call('HDEL', K_DONE, sid)
    redis.call('LREM', K_DONE_ORDER, 1, sid)
    -- 'r': a requeue's put token names no instance, so whoever settles the sample publishes it (see own_settle)
    redis.call('HSET', K_REFS, sid, 'r' .. ARGS[2] .. i .. '\t' .. letter_ref(letter))
    enqueue({'0\t' .. sid})
    emit('requeue', sid, '', '0', 1)
    requeued[#requeued + 1] = sid
  end
end
keep_letters(letters, chosen)
redis.call('HINCRBY', K_STATS, 'requeued', count_arg(#requeued))
return {'ok', events, requeued}
