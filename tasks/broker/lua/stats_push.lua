-- KEYS: worker stats, when each worker pushed them, when each worker's stats changed,
-- each worker's push before that change[, the number of the worker's last batch of
-- counts added, then the counters' hashes]. ARGV: worker, its stats (JSON)[, the
-- batch's number, how long that number is kept (s), each hash's expiry (s, 0: none),
-- then (hash's place among them from 1, field, amount) triples].
-- A worker's own stats, stamped on Redis' clock (no worker's clock is trusted), and the
-- counts of the jobs it finished since its last push: a batch sent again after a lost
-- reply is not added twice. Stats the same as the last are only stamped: beat reads
-- the records changed since its last round.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  redis.call('HSET', KEYS[4], ARGV[1], redis.call('ZSCORE', KEYS[2], ARGV[1]) or '0')
  redis.call('ZADD', KEYS[3], now, ARGV[1])
end
redis.call('ZADD', KEYS[2], now, ARGV[1])
if KEYS[5] and tonumber(redis.call('GET', KEYS[5]) or '0') < tonumber(ARGV[3]) then
  local hashes = #KEYS - 5
  for i = 5 + hashes, #ARGV, 3 do
    redis.call('HINCRBYFLOAT', KEYS[5 + tonumber(ARGV[i])], ARGV[i + 1], ARGV[i + 2])
  end
  for h = 1, hashes do
    if tonumber(ARGV[4 + h]) > 0 then redis.call('EXPIRE', KEYS[5 + h], ARGV[4 + h]) end
  end
  redis.call('SET', KEYS[5], ARGV[3], 'EX', ARGV[4])
end
return 1
