-- KEYS: list, '' (unused), the lane's lists, then (or '' when unused) the account's fast
-- places, a claimed run's pointer, the run the job leads, the job's lease and run
-- counter, the fast-time balances hash; then the depths per lane and per list, the
-- preemptible runs, then (or '' when no claim is made) the result cache's entry, LRU set
-- and metrics hash.
-- ARGV: message, the wake channels' prefix, the lane's maximum depth (0: none), deadline (Redis'
-- unix s, 0: none), fast places allowed (0: take none; below 0: take none, and refuse
-- unless all -allowed are taken: a job routed over its account's fast limit), place
-- lapse s, job id, run ttl s, fence token ('' : none), the fenced run's number, how
-- long a released lease is kept, the prefix a released lease starts with, the lane's
-- rank (0: fast), the account, an uncharged account's fast seconds, '1' to push at the
-- front (the end taken next), the fast-news channels' prefix, the job's lane clock (unix s:
-- when it entered its lane; 0: not indexed), the due indexes' key prefix; then the
-- claim's admit flag, follower JSON, now, tier rank, claim lifetime s and run keys'
-- prefix (lua/claim.lua); then the lane's admission bound ('' : none) and, for the lane
-- and each above it, its name and seconds per queued job (routing.policy.over_budget).
-- Returns 1 (pushed), or a refusal having written nothing: 0 the lane is full,
-- -1 too late, -2 the account's fast places are taken, -3 the fence does not hold,
-- -4 the account's fast time is spent (its balance is at or below zero), -5 the job was
-- routed over its account's fast limit but a fast place is free now, -6 the work queued
-- ahead (the lanes' live depths, each job priced) is at or past the admission bound.
-- With a claim (a seeded job: ``tasks.jobs.cache``), the digest is claimed first, in
-- the same step: a stored result ({'hit', result}), a run to follow ({'follow',
-- leader}) or one being claimed ({'solo', ''}) is answered and nothing is pushed; a
-- claim it leads goes on as a publish that confirms it (a refusal after it leaves the
-- claim provisional, for the next publish of the job to confirm, or to lapse).
-- The run the job leads, if it exists, takes the lane's rank unless it is slower
-- already: callers join only runs waiting in a lane as fast as their own tier.
-- The lane's depth is one counter (lua/queue.lua), whatever the number of its lists.
-- The same message published again at once (redis-py sends a command again on a new
-- connection after a broken one) finds itself where it was pushed and does nothing; a
-- retry's publish tried again later is stopped by its fence (the lease released).
-- A fast job pushed is told to one worker (lua/fast_news.lua): the one whose own queue
-- it is in, else the preemptible run best stopped; it hears within a step
-- (gpu_worker.preempt).
-- include: holds
-- include: queue
-- include: fast_news
-- include: claim
if redis.call('LINDEX', KEYS[1], ARGV[16] == '1' and -1 or 0) == ARGV[1] then return 1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
if tonumber(ARGV[4]) > 0 and now > tonumber(ARGV[4]) then return -1 end
if ARGV[9] ~= '' and not holds(KEYS[7], KEYS[8], ARGV[9], ARGV[10]) then return -3 end
if KEYS[13] ~= '' then
  local answer = claim_run({KEYS[13], KEYS[14], KEYS[5], KEYS[6], KEYS[15]},
                           {ARGV[7], ARGV[20], ARGV[21], ARGV[22], ARGV[23], ARGV[24], ARGV[25]})
  if answer[1] ~= 'lead' then return answer end
end
if KEYS[9] ~= '' then
  local left = redis.call('HGET', KEYS[9], ARGV[14]) or ARGV[15]
  if tonumber(left) <= 0 then return -4 end
end
local limit = tonumber(ARGV[3])
if limit > 0 then
  if tonumber(redis.call('HGET', KEYS[10], lane_of(KEYS[1])) or '0') >= limit then
    return 0
  end
end
if ARGV[26] ~= '' then
  local ahead = 0
  for i = 27, #ARGV, 2 do
    ahead = ahead + tonumber(redis.call('HGET', KEYS[10], ARGV[i]) or '0') * tonumber(ARGV[i + 1])
  end
  if ahead >= tonumber(ARGV[26]) then return -6 end
end
local places = tonumber(ARGV[5])
if places ~= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  local taken = redis.call('ZCARD', KEYS[4])
  if places < 0 then
    if taken < -places then return -5 end
  else
    if taken >= places then return -2 end
    redis.call('ZADD', KEYS[4], now + tonumber(ARGV[6]), ARGV[7])
    redis.call('EXPIRE', KEYS[4], math.ceil(tonumber(ARGV[6])) + 60)
  end
end
if KEYS[5] ~= '' and redis.call('GET', KEYS[5]) == ARGV[7] then
  redis.call('EXPIRE', KEYS[5], ARGV[8])
  redis.call('HSET', KEYS[6], 'confirmed', '1')
  redis.call('EXPIRE', KEYS[6], ARGV[8])
end
if KEYS[6] ~= '' then
  local rank = redis.call('HGET', KEYS[6], 'rank')
  if rank and tonumber(rank) < tonumber(ARGV[13]) then
    redis.call('HSET', KEYS[6], 'rank', ARGV[13])
  end
end
if ARGV[9] ~= '' then
  redis.call('SET', KEYS[7], ARGV[12] .. ARGV[10], 'EX', ARGV[11])
end
redis.call(ARGV[16] == '1' and 'RPUSH' or 'LPUSH', KEYS[1], ARGV[1])
pushed({KEYS[10], KEYS[11], ARGV[19], ARGV[2]}, KEYS[1], ARGV[1], ARGV[18])
redis.call('SADD', KEYS[3], KEYS[1])
if tonumber(ARGV[13]) == 0 then tell_fast(KEYS[12], ARGV[17], KEYS[1]) end
return 1
