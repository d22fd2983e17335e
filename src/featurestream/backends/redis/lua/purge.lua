-- ARGV: the sample ids (none: every dead letter). All or nothing: refused when an id names no dead letter.
-- Purged letters leave the list for good; kept bytes are released: their ids go on the ``retired`` feed (the
-- producing instance scrubs them) and their refs go back to the caller (which scrubs them in its store).
local letters = redis.call('LRANGE', K_DEAD, 0, -1)
local chosen, unknown, sids = chosen_letters(letters, 2)
if not chosen then
  return {'unknown', events, unknown}
end
local purged, released, released_refs = {}, {}, {}
for i, letter in ipairs(letters) do
  if chosen[i] then
    purged[#purged + 1] = sids[i]
    emit('purge', sids[i], '')
    if unkeep(sids[i]) then
      released[#released + 1] = sids[i]
      released_refs[#released_refs + 1] = letter_ref(letter)
    end
  end
end
keep_letters(letters, chosen)
if #released > 0 then
  publish(released)
end
redis.call('HINCRBY', K_STATS, 'purged', count_arg(#purged))
return {'ok', events, purged, released_refs}
