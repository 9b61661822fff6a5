-- KEYS: the preemption claims, then the shared fast lists, then this worker's own fast
-- lists.
-- ARGV: the claimant (a worker process), how long its claim counts (s), how many of the
-- lists are the worker's own.
-- Returns 1 when the claimant is to stop its job for a waiting fast one (a claim on a
-- shared one is recorded), else 0. A fast job in the worker's own queue is for it alone; one in the
-- shared lane is for one preempting worker per job waiting (the claims still counting
-- are as many jobs already spoken for). A worker drops its claim as its next run begins.
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local first_own = #KEYS - tonumber(ARGV[3]) + 1
local shared, own = 0, 0
for i = 2, #KEYS do
  local n = redis.call('LLEN', KEYS[i])
  if i >= first_own then own = own + n else shared = shared + n end
end
if own > 0 then return 1 end  -- its own queue's: no other worker's to claim
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREM', KEYS[1], ARGV[1])
if shared <= redis.call('ZCARD', KEYS[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return 1
