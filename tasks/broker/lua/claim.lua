-- The result cache's claim of a job's digest (``tasks.jobs.cache``), shared by
-- ``cache_claim.lua`` and the publish (``publish.lua``), which claims and publishes in
-- one step.
-- KEYS: cache entry, LRU set, in-flight pointer, the caller's run, the metrics hash
-- (cache_hits / cache_joins / cache_misses counted there). ARGV: caller id,
-- 'a' (admit) and/or 'd' (drop the entry: its PNG is gone or changed), follower JSON,
-- now, tier rank, seconds an unpublished claim lives, the run keys' prefix.
-- A caller joins a run only if the run's rank, the lane its leader's message is in (set
-- by the publish and raised by every move down a lane: ``publish.lua``, ``move.lua``), is as
-- fast as the caller's tier: a fast job never waits in a relaxed run, whatever sent that
-- run's leader there (its tier, its account's spent fast time, a deadline, a retry); it
-- leads its own, and later callers join the faster one. Until its publish, a claim's
-- rank is its leader's tier.
-- A claim is provisional until the publish of its job confirms it (``tasks.broker.publish``):
-- nobody joins it before, and one whose job was never published lapses by itself.
-- A caller finding such a claim runs alone ('solo').
-- ``k``: the KEYS above, ``a``: the ARGV above (in that order). Returns
-- {verdict, value}: 'hit' (the stored result), 'follow' (the leader), 'solo', 'lead'.
local function claim_run(k, a)
  if string.find(a[2], 'd', 1, true) then
    redis.call('DEL', k[1])
    redis.call('ZREM', k[2], k[1])
    redis.call('HINCRBY', k[5], 'cache_hits', -1)  -- the first call's hit was none
  else
    local hit = redis.call('GET', k[1])
    if hit then
      redis.call('ZADD', k[2], 'XX', a[4], k[1])
      redis.call('HINCRBY', k[5], 'cache_hits', 1)
      return {'hit', hit}
    end
  end
  local admit = string.find(a[2], 'a', 1, true) and '1' or '0'
  local leader = redis.call('GET', k[3])
  if leader then
    local run = a[7] .. leader
    local rank = redis.call('HGET', run, 'rank')
    if rank and tonumber(rank) <= tonumber(a[5]) then
      if redis.call('HGET', run, 'confirmed') ~= '1' then
        redis.call('HINCRBY', k[5], 'cache_misses', 1)
        return {'solo', ''}
      end
      redis.call('HSET', run, 'f:' .. a[1], a[3])
      if admit == '1' then redis.call('HSET', run, 'admit', '1') end
      redis.call('HINCRBY', k[5], 'cache_joins', 1)
      return {'follow', leader}
    end
  end
  redis.call('SET', k[3], a[1], 'EX', a[6])
  redis.call('HSET', k[4], 'pointer', k[3], 'entry', k[1], 'admit', admit,
             'rank', a[5])
  redis.call('EXPIRE', k[4], a[6])
  redis.call('HINCRBY', k[5], 'cache_misses', 1)
  return {'lead', ''}
end
