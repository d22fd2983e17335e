-- ARGV: (lease key, token, sample id) per lease; replies one status per lease. A fail whose sample the store
-- lost: dead-lettered at once with reason 'lost'.
reap()
return {settle_batch('fail', 'failed', 'dead-lettered', lose_live), events}
