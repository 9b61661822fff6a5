-- KEYS: the holder's records, the set of holders. ARGV: the holder.
-- A holder whose records are empty leaves the set, in one step: one that took again
-- meanwhile (a frozen worker woken) stays in it, so beat still finds what it holds.
if redis.call('EXISTS', KEYS[1]) == 0 then return redis.call('SREM', KEYS[2], ARGV[1]) end
return 0
