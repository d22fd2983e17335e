-- ARGV: lease key, token, seconds, call id. A retry after a lost reply gets the first run's reply (with this
-- run's now, against which the client reads the deadline), so a lease is extended and counted once per call.
local key, token, extra, call = ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local again = recalled(call)
if again then
  if again[1] == 'ok' then
    again[4] = fmt(clock())
  end
  return again
end
reap()
local live, n, _, sid = live_lease(key, token)
if live then
  local deadline = fmt(clock() + extra)
  redis.call('ZADD', K_DEADLINES, deadline, key)
  redis.call('HINCRBY', K_STATS, 'extended', '1')
  emit('extend', sid, key, n, 0, 0, deadline)
  return remember(call, {'ok', events, deadline, fmt(clock())})
end
stale('extend', key, redis.call('HEXISTS', K_LEASES, key) == 1)
return remember(call, {'lost', events})
