-- whether beat's leader of ``epoch`` still leads (``tasks.broker.leader``): a paused
-- or cut-off old leader, once a standby took over, changes nothing. '' : not a write
-- of beat's (a worker's), always allowed.
local function leads(epoch_key, epoch)
  return epoch == '' or redis.call('GET', epoch_key) == epoch
end
