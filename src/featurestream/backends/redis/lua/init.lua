-- ARGV: keep_dead_letter_bytes. Creates the queue unless it exists; replies its stored settings
-- (layout, max_deliveries, dedup_window, keep_dead_letter_bytes) and the newest id of the retired feed.
redis.call('HSETNX', K_META, 'state', 'open')
redis.call('HSETNX', K_META, 'layout', LAYOUT)
redis.call('HSETNX', K_META, 'max_deliveries', MAX_DELIVERIES)
redis.call('HSETNX', K_META, 'dedup_window', DEDUP_WINDOW)
redis.call('HSETNX', K_META, 'keep_bytes', ARGV[2])
local config = redis.call('HMGET', K_META, 'layout', 'max_deliveries', 'dedup_window', 'keep_bytes')
local last = redis.call('XREVRANGE', K_RETIRED, '+', '-', 'COUNT', 1)
config[5] = last[1] and last[1][1] or '0-0'
return config
