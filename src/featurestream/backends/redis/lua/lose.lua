-- ARGV: call id, then (lease key, token, sample id) per lease; replies one status per lease. A fail whose
-- sample the store lost: dead-lettered at once with reason 'lost'. A retry gets the first run's reply, as fail's.
local again = recalled(ARGS[2])
if again then
  return again
end
reap()
return remember(ARGS[2], {settle_batch('fail', 'failed', 'dead-lettered', lose_live), events})
