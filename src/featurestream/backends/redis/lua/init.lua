redis.call('HSETNX', K_META, 'state', 'open')
redis.call('HSETNX', K_META, 'layout', LAYOUT)
redis.call('HSETNX', K_META, 'max_deliveries', MAX_DELIVERIES)
redis.call('HSETNX', K_META, 'dedup_window', DEDUP_WINDOW)
local ok, err = pcall(redis.call, 'XGROUP', 'CREATE', K_STREAM, GROUP, '$', 'MKSTREAM')
if not ok and not string.find(tostring(err), 'BUSYGROUP') then
  error(err)
end
local config = redis.call('HMGET', K_META, 'layout', 'max_deliveries', 'dedup_window')
local last = redis.call('XREVRANGE', K_RETIRED, '+', '-', 'COUNT', 1)
config[4] = last[1] and last[1][1] or '0-0'
return config
