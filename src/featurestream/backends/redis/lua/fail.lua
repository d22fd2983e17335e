-- ARGV: (lease key, token, sample id) per lease; replies one status per lease.
reap()
return {settle_batch('fail', 'failed', 'dead-lettered', fail_live), events}
