-- KEYS: worker stats, when each worker pushed them[, the number of the worker's last
-- batch of counts added, then the counters' hashes]. ARGV: worker, its stats (JSON)[,
-- the batch's number, how long that number is kept (s), each hash's expiry (s, 0:
-- none), then (hash's place among them from 1, field, amount) triples].
-- A worker's own stats, stamped on Redis' clock (no worker's clock is trusted), and the
-- counts of the jobs it finished since its last push: a batch sent again after a lost
-- reply is not added twice.
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], tonumber(t[1]) + tonumber(t[2]) / 1e6, ARGV[1])
if KEYS[3] and tonumber(redis.call('GET', KEYS[3]) or '0') < tonumber(ARGV[3]) then
  local hashes = #KEYS - 3
  for i = 5 + hashes, #ARGV, 3 do
    redis.call('HINCRBYFLOAT', KEYS[3 + tonumber(ARGV[i])], ARGV[i + 1], ARGV[i + 2])
  end
  for h = 1, hashes do
    if tonumber(ARGV[4 + h]) > 0 then redis.call('EXPIRE', KEYS[3 + h], ARGV[4 + h]) end
  end
  redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[4])
end
return 1
