-- KEYS: a lane's set of lists, beat's epoch. ARGV: beat's epoch.
-- Drops the lists that are empty now: every push adds its list back in the same call
-- or transaction, so a list that holds jobs is never left out of the set.
-- include: fence
if not beat_leads(KEYS[2], ARGV[1]) then return 0 end
local dropped = 0
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('LLEN', key) == 0 then
    redis.call('SREM', KEYS[1], key)
    dropped = dropped + 1
  end
end
return dropped
