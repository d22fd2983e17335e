if is_open() then
  set_state('draining')
  emit('close', '', '')
  after_retire()
  redis.call('XADD', K_WAKE, 'MAXLEN', '1', '*', 'wake', 'close')
end
return {'ok', events}
