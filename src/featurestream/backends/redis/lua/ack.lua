-- ARGV: (lease key, token, sample id) per lease; replies one status per lease. A retried ack whose reply was not
-- remembered finds the leases it acked by their dedup records ('again').
reap()
return {settle_batch('ack', 'acked', 'acked', ack_live), events}
