if is_open() then
  redis.call('HSET', K_META, 'state', 'draining')
  emit('close', '', '')
  after_retire()
  redis.call('XADD', K_WAKE, 'MAXLEN', '1', '*', 'wake', 'close')
end
return {'ok', events}
