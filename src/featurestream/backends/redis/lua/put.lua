-- ARGV: sample id, ref JSON, put token, mode: '' (enqueue) or 'idle' (enqueue only into an empty queue: a
-- paused producer's put)
feed()
reap()
local sid, ref, token, mode = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local held = redis.call('HGET', K_REFS, sid)
if not is_open() then
  -- whether the id is queued all the same: then its retain belongs to that queued sample
  return {'closed', events, held and 1 or 0}
end
local done = not held and redis.call('HGET', K_DONE, sid)
local why, outcome = put_verdict(sid, held, done, token)
if why == 'again' then
  -- a retry after a lost reply that was not remembered: this very put took effect; the third item says whether
  -- it settled since
  return {'ok', events, settled_since(sid, held)}
end
if why == 'dedup' then
  refuse_dedup(sid)
  return {'dedup', events, outcome}
end
if why then
  return {why, events}
end
if mode == 'idle' and redis.call('HLEN', K_REFS) ~= 0 then
  return {'busy', events}
end
put_new({{sid, ref, token}})
return {'ok', events}
