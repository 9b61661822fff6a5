-- An account's fast places (tasks.jobs.fastlimit): sorted set ``key`` of its queued fast
-- jobs, each lapsing at its score. ``allowed`` above 0: take one for ``job`` (refused
-- 'fast_places' when all are taken); below 0: take none, and refuse ('place_free')
-- unless all -allowed are taken (a job routed over its account's limit: a place came
-- back meanwhile, and the job should have it). Returns the refusal, or nil.
local function take_place(key, allowed, lapse_s, job, now)
  -- live places only, read: a publish's first write must be one Redis refuses while
  -- out of memory (ZADD), for it to refuse the whole publish
  local taken = redis.call('ZCOUNT', key, '(' .. now, '+inf')
  if allowed < 0 then
    if taken < -allowed then return 'place_free' end
    return nil
  end
  if taken >= allowed then return 'fast_places' end
  redis.call('ZADD', key, now + lapse_s, job)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  redis.call('EXPIRE', key, math.ceil(lapse_s) + 60)
  return nil
end
