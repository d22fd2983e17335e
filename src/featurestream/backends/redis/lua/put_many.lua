-- ARGV: base put token, then (sample id, ref JSON) pairs; item i's put token is base .. i. A base token '?' ..
-- token only checks: refuse as a put would, else reply 'fresh' and enqueue nothing.
-- All or nothing: any refused item refuses the batch, which then changes nothing but the refusal's count.
-- A refusal replies the offending id, the outcome (dedup) and, per item, whether the queue holds that id.
feed()
reap()
local base, sids = ARGV[2], {}
local check = string.sub(base, 1, 1) == '?'
for i = 3, #ARGV, 2 do
  sids[#sids + 1] = ARGV[i]
end
local held = redis.call('HMGET', K_REFS, unpack(sids))
local function held_flags()
  local flags = {}
  for j = 1, #sids do
    flags[j] = held[j] and 1 or 0
  end
  return flags
end
if not is_open() then
  return {'closed', events, '', '', held_flags()}
end
local done = redis.call('HMGET', K_DONE, unpack(sids))
local fresh, settled, any_settled = {}, {}, false
for j, sid in ipairs(sids) do
  local why, outcome = put_verdict(sid, held[j], done[j], base .. j)
  settled[j] = why == 'again' and settled_since(sid, held[j]) or 0
  any_settled = any_settled or settled[j] ~= 0
  if why == 'dedup' then
    refuse_dedup(sid)
    return {'dedup', events, sid, outcome, held_flags()}
  end
  if why == 'held' or why == 'kept' then
    return {why, events, sid, '', held_flags()}
  end
  if why == nil then
    fresh[#fresh + 1] = {sid, ARGV[2 * j + 2], base .. j}
  end
end
if check then
  return {'fresh', events}
end
if #fresh > 0 then
  put_new(fresh)
end
if any_settled then
  return {'ok', events, settled}
end
return {'ok', events}
