-- ARGV: (lease key, token, sample id) per lease; replies one status per lease
reap()
return {settle_batch('ack', 'acked', 'acked', ack_live), events}
