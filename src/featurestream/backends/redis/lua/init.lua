-- ARGV: keep_dead_letter_bytes, store_uri ('' pins none: an operator's handle has no store). Creates the queue
-- unless it exists, pinning the first store_uri given; replies its stored settings (layout, max_deliveries,
-- dedup_window, keep_dead_letter_bytes, store_uri or '') and the newest id of the retired feed. Drops the
-- remembered replies whose time is up, as the reaper's call does.
redis.call('HSETNX', K_META, 'state', 'open')
redis.call('HSETNX', K_META, 'layout', LAYOUT)
redis.call('HSETNX', K_META, 'max_deliveries', MAX_DELIVERIES)
redis.call('HSETNX', K_META, 'dedup_window', DEDUP_WINDOW)
redis.call('HSETNX', K_META, 'keep_bytes', ARGV[2])
if ARGV[3] ~= '' and redis.call('HGET', K_META, 'layout') == LAYOUT then  -- another layout's queue: untouched
  redis.call('HSETNX', K_META, 'store_uri', ARGV[3])
end
local config = redis.call('HMGET', K_META, 'layout', 'max_deliveries', 'dedup_window', 'keep_bytes', 'store_uri')
config[5] = config[5] or ''
prune_calls()
local last = redis.call('XREVRANGE', K_RETIRED, '+', '-', 'COUNT', 1)
config[6] = last[1] and last[1][1] or '0-0'
return config
