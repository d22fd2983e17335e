-- ARGV[2]: why a failed producer closed the queue ('' for a plain close), kept in ``meta`` as ``cause`` for every
-- instance to read; the first cause stands, also one given to a queue closed already.
if ARGV[2] ~= '' then
  redis.call('HSETNX', K_META, 'cause', ARGV[2])
end
if is_open() then
  set_state('draining')
  emit('close', '', '')
  after_retire()
  redis.call('XADD', K_WAKE, 'MAXLEN', '1', '*', 'wake', 'close')
end
return {'ok', events}
