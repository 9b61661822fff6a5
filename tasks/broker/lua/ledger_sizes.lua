-- KEYS: ledger, depths per list.
-- Returns {ledger entries, messages held in the lists the ledger counts any in}: more
-- entries than messages held is a take in flight, or a message lost with its taker.
-- It reads only the lists that hold jobs, whatever the number of workers.
local held = 0
for _, key in ipairs(redis.call('HKEYS', KEYS[2])) do
  held = held + redis.call('LLEN', key)
end
return {redis.call('HLEN', KEYS[1]), held}
