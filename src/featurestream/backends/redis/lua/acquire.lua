-- ARGV: visibility timeout, base lease token, how many leases at most
reap()
local reply = {'ok', events}
if lease_entries(tonumber(ARGV[4]), tonumber(ARGV[2]), ARGV[3], reply) > 0 then
  return reply
end
return empty_reply()
