-- ARGV: (lease key, token, sample id) per lease; replies one status per lease. Unused leases handed back: each
-- sample goes to the pending tail with its redelivery count unchanged (no delivery spent).
reap()
return {settle_batch('give_back', 'given_back', 'given-back', give_back_live), events}
