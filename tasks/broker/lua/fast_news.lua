-- Tell one worker of a fast job pushed to list ``key``: the worker whose own queue it is,
-- else the preemptible run best stopped for it (``index``: relaxed runs before standard
-- ones, the latest begun first), taken off the index so that the next fast job is told
-- to another. One PUBLISH to one subscriber, whatever the number of workers.
local function tell_fast(index, prefix, key)
  local own = string.match(key, '^[^%.\6]+%.([^\6]+)')
  if own then return redis.call('PUBLISH', prefix .. own, key) end
  local victim = redis.call('ZPOPMAX', index)
  if victim[1] then return redis.call('PUBLISH', prefix .. victim[1], key) end
  return 0
end
