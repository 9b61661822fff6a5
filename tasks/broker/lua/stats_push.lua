-- KEYS: worker stats, when each worker pushed them. ARGV: worker, its stats (JSON).
-- A worker's own stats, stamped on Redis' clock (no worker's clock is trusted).
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], tonumber(t[1]) + tonumber(t[2]) / 1e6, ARGV[1])
return 1
