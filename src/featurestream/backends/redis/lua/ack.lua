-- ARGV: call id, then (lease key, token, sample id) per lease; replies one status per lease. A retried ack
-- finds the leases it acked by their dedup records ('again'); the reply is remembered (see recalled) only when it
-- rejected a lease, whose count a retry must not repeat, so the common ack writes nothing more.
local again = recalled(ARGS[2])
if again then
  return again
end
reap()
local statuses = settle_batch('ack', 'acked', 'acked', ack_live)
for _, status in ipairs(statuses) do
  if status == 'stale' then
    return remember(ARGS[2], {statuses, events})
  end
end
return {statuses, events}
