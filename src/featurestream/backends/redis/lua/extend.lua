-- ARGV: lease key, token, seconds
reap()
local key, token, extra = ARGV[2], ARGV[3], tonumber(ARGV[4])
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
