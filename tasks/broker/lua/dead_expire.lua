-- KEYS: dead letters, dead-letter index (job id -> when it failed), beat's epoch.
-- ARGV: cutoff (unix s: letters that failed before it go; '+inf': every one), most
-- letters to drop, beat's epoch ('' : not beat's expiry, an operator's purge).
-- Letter and index entry go together: the index never names a letter that is gone.
-- Returns {letters dropped, letters the index lacks}; the second is non-zero only for
-- letters written before the index existed, which the caller indexes (dead_index).
-- include: fence
if not leads(KEYS[3], ARGV[3]) then return {0, 0} end
local ids = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1], 'LIMIT', 0, ARGV[2])
if #ids > 0 then
  redis.call('HDEL', KEYS[1], unpack(ids))
  redis.call('ZREM', KEYS[2], unpack(ids))
end
return {#ids, redis.call('HLEN', KEYS[1]) - redis.call('ZCARD', KEYS[2])}
