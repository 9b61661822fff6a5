-- KEYS: a lane's set of lists. Drops the lists that are empty now: every push adds
-- its list back in the same call or transaction, so a list that holds jobs is never
-- left out, and the depth check of a publish reads only lists that may hold some.
local dropped = 0
for _, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if redis.call('LLEN', key) == 0 then
    redis.call('SREM', KEYS[1], key)
    dropped = dropped + 1
  end
end
return dropped
