-- KEYS: ledger, unacked, the lane's lists. ARGV: old tag, old entry, new tag, new
-- entry, new message.
-- Put a lost message back at the front of its list under a new delivery tag, so
-- that the lost copy, should its worker wake up after all, and the new one are
-- never confused in kombu's unacked records.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
local cut = string.find(ARGV[2], '\n', 1, true)
local key = string.sub(ARGV[2], 1, cut - 1)
if redis.call('LPOS', key, string.sub(ARGV[2], cut + 1)) then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
redis.call('RPUSH', key, ARGV[5])
redis.call('SADD', KEYS[3], key)
return 1
