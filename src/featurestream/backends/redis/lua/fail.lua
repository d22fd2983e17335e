-- ARGV: call id, then (lease key, token, sample id) per lease; replies one status per lease. A retry after a
-- lost reply gets the first run's reply (a redelivery leaves nothing else a retry could recognise it by).
local again = recalled(ARGS[2])
if again then
  return again
end
reap()
return remember(ARGS[2], {settle_batch('fail', 'failed', 'dead-lettered', fail_live), events})
