-- ARGV: visibility timeout, base lease token, how many leases at most, how long (seconds) the caller will
-- block for one when there is none
reap()
local reply = {'ok', events}
if lease_entries(tonumber(ARGV[4]), tonumber(ARGV[2]), ARGV[3], reply) > 0 then
  return reply
end
return empty_reply(tonumber(ARGV[5]))
