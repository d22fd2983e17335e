-- replies how many leases it reaped, the lifecycle state, how many samples the queue holds and, when the caller
-- traces, the state the call left (traced_state): a producer's round traces its Pause or Resume with it. The
-- reaper's call, so it also drops the remembered replies whose time is up.
feed()
local count = reap()
prune_calls()
local left = TRACE and traced_state() or ''
return {'ok', events, count, read_meta(), redis.call('HLEN', K_REFS), left}
