-- KEYS: holders, kombu's unacked hash and index. ARGV: delivery tag, this process.
-- An ack: the message's records go, unless another process holds that tag now.
local who = redis.call('HGET', KEYS[1], ARGV[1])
if who and ARGV[2] ~= '' and who ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
