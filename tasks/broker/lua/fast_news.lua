-- Tell one worker of a fast job pushed to list ``key``: the worker whose own queue it is,
-- else the preemptible run best stopped for it (``index``: relaxed runs before standard
-- ones, later levels first, the latest begun first; scored ``least`` or more), taken off
-- the index so that the next job is told to another. One PUBLISH to one subscriber,
-- whatever the number of workers.
local function tell_fast(index, prefix, key, least)
  local own = string.match(key, '^[^%.\6]+%.([^\6]+)')
  if own then return redis.call('PUBLISH', prefix .. own, key) end
  local victim = redis.call('ZREVRANGEBYSCORE', index, '+inf', least or '-inf', 'LIMIT', 0, 1)
  if victim[1] then
    redis.call('ZREM', index, victim[1])
    return redis.call('PUBLISH', prefix .. victim[1], key)
  end
  return 0
end
-- The same for a standard job pushed at the lane's first level (routing.names.
-- FIRST_STEPS: no suffix, or step 1): told only to a run heavier than that level
-- (``least``: the index score of standard's second level), which steps aside for it.
local function tell_first(index, prefix, key, least)
  local step = string.match(key, '\6\22([0-9]+)$')
  if step == nil or step == '1' then return tell_fast(index, prefix, key, least) end
  return 0
end
