-- KEYS: worker stats, when each worker pushed them[, the counters, the number of the
-- worker's last batch of counts added]. ARGV: worker, its stats (JSON)[, the batch's
-- number, how long that number is kept (s), then (counter, amount) pairs].
-- A worker's own stats, stamped on Redis' clock (no worker's clock is trusted), and the
-- counts of the jobs it finished since its last push: a batch sent again after a lost
-- reply is not added twice.
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], tonumber(t[1]) + tonumber(t[2]) / 1e6, ARGV[1])
if KEYS[3] and tonumber(redis.call('GET', KEYS[4]) or '0') < tonumber(ARGV[3]) then
  for i = 5, #ARGV, 2 do redis.call('HINCRBYFLOAT', KEYS[3], ARGV[i], ARGV[i + 1]) end
  redis.call('SET', KEYS[4], ARGV[3], 'EX', ARGV[4])
end
return 1
