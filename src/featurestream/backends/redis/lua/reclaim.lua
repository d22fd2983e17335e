-- replies how many leases it reaped, the lifecycle state, how many samples the queue holds and, when the caller
-- traces, the state the call left as an event's fourth item ({'', pending, leased, now, ''}): a producer's round
-- traces its Pause or Resume with it
feed()
local count = reap()
local left = TRACE and {'', traced_pending, traced_leased, fmt(clock()), ''} or ''
return {'ok', events, count, read_meta(), redis.call('HLEN', K_REFS), left}
