-- ARGV: lease key, token, seconds. Replies the new deadline and this run's now (against which the client reads
-- it; a retry after a lost reply gets the first run's deadline with its own now: see replay).
local key, token, extra = ARGV[2], ARGV[3], tonumber(ARGV[4])
reap()
local live, n, _, sid = live_lease(key, token)
if live then
  local deadline = fmt(clock() + extra)
  redis.call('ZADD', K_DEADLINES, deadline, key)
  redis.call('HINCRBY', K_STATS, 'extended', '1')
  emit('extend', sid, key, n, 0, 0, deadline)
  return {'ok', events, deadline, fmt(clock())}
end
stale('extend', key, redis.call('HEXISTS', K_LEASES, key) == 1)
return {'lost', events}
