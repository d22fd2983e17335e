-- ARGV: (lease key, token, sample id) per lease; replies one status per lease
reap()
local statuses = {}
for i = 2, #ARGV, 3 do
  statuses[#statuses + 1] = fail_one(ARGV[i], ARGV[i + 1], ARGV[i + 2])
end
return {statuses, events}
