-- ARGV: call id, then (lease key, token, sample id) per lease; replies one status per lease. A retried ack
-- finds the leases it acked by their dedup records ('again') and counts its rejections once (counts_rejections).
reap()
return {settle_batch('ack', 'acked', 'acked', ack_live), events}
