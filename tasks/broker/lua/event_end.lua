-- KEYS: a prediction's record. ARGV: its completed event's data, '1' to end the log only
-- if its job never began. Ends the prediction's event log (lua/events.lua) where the
-- job's own end was not logged: a cancel while it waits (a run that began logs its own
-- end), or a final state stored apart. Returns 1 when logged.
-- include: events
if ARGV[2] == '1' and redis.call('HEXISTS', KEYS[1], 'began') == 1 then return 0 end
if add_event(KEYS[1], 'completed', ARGV[1]) then return 1 end
return 0
