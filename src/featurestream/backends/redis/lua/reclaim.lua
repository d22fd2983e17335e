-- replies how many leases it reaped, the lifecycle state and how many samples the queue holds
feed()
local count = reap()
return {'ok', events, count, read_meta(), redis.call('HLEN', K_REFS)}
