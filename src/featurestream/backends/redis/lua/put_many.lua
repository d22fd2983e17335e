-- ARGV: base put token, then (sample id, ref JSON) pairs; item i's put token is base .. i.
-- All or nothing: any refused item refuses the batch, which then changes nothing but the refusal's count.
feed()
reap()
local base = ARGV[2]
local function held_flags()
  local flags = {}
  for i = 3, #ARGV, 2 do
    flags[#flags + 1] = redis.call('HEXISTS', K_REFS, ARGV[i])
  end
  return flags
end
if not is_open() then
  return {'closed', events, '', '', held_flags()}
end
local fresh = {}
for i = 3, #ARGV, 2 do
  local sid = ARGV[i]
  local why, outcome = put_check(sid, base .. ((i - 1) / 2))
  if why == 'dedup' then
    refuse_dedup(sid)
    return {'dedup', events, sid, outcome, held_flags()}
  end
  if why == 'held' then
    return {'held', events, sid, '', held_flags()}
  end
  fresh[i] = why == nil
end
for i = 3, #ARGV, 2 do
  if fresh[i] then
    put_new(ARGV[i], ARGV[i + 1], base .. ((i - 1) / 2))
  end
end
return {'ok', events}
