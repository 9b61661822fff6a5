-- whether beat's leader of ``epoch`` still leads (``tasks.broker.leader``): a paused
-- or cut-off old leader, once a standby took over, changes nothing. '' : not a write
-- of beat's (a worker's), always allowed.
local function leads(epoch_key, epoch)
  return epoch == '' or redis.call('GET', epoch_key) == epoch
end
-- the same for a write only beat makes (the heartbeat's, the audit's): without an epoch
-- (beat's code run outside a lead, say on a worker) it is refused too.
local function beat_leads(epoch_key, epoch)
  return epoch ~= '' and redis.call('GET', epoch_key) == epoch
end
