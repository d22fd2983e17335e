-- ARGV: lease key, token, seconds
reap()
local key, token, extra = ARGV[2], ARGV[3], tonumber(ARGV[4])
local entry, _, _, sid = live_lease(key, token)
if entry then
  local deadline = clock() + extra
  redis.call('ZADD', K_DEADLINES, fmt(deadline), key)
  redis.call('HINCRBY', K_STATS, 'extended', '1')
  emit('extend', sid, key)
  return {'ok', events, fmt(deadline), fmt(clock())}
end
stale('extend', key, redis.call('HEXISTS', K_LEASES, key) == 1)
return {'lost', events}
