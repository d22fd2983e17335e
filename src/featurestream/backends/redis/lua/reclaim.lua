-- replies how many leases it reaped, the lifecycle state and how many samples the queue holds
feed()
local count = reap()
return {'ok', events, count, redis.call('HGET', K_META, 'state'), redis.call('HLEN', K_REFS)}
