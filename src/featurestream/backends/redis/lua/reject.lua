-- ARGV[2]: the dead letters' reason; ARGV[3:]: (lease key, token, sample id) per lease; replies one status per
-- lease. A fail of a sample no consumer can train: dead-lettered at once with that reason.
reap()
return {settle_batch('fail', 'failed', 'dead-lettered', reject_live, 3), events}
