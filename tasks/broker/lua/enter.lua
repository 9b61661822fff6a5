-- A job's message enters its list, shared by both publishes (publish.lua, copy.lua).
-- ``k``: {list, the lane's lists, depths per lane, depths per list, preemptible runs};
-- ``a``: the named ARGV (message, entered: its lane clock, rank: its lane's, 0 fast;
-- the due, wake and fast-news prefixes, heavier: the least score of a run a first-level
-- standard job is told to). The same message published again at once
-- (redis-py sends a command again on a new connection after a broken one) finds
-- itself where it went and is not pushed twice (``already``).
-- include: queue
-- include: fast_news
local function already(k, a, front)
  return redis.call('LINDEX', k[1], front and -1 or 0) == a.message
end
-- Pushed (at the front: taken next), counted, indexed and announced (lua/queue.lua), the
-- list registered with its lane, and a fast job told to one worker, a first-level standard
-- job to the worker whose own queue it is in (lua/fast_news.lua).
local function enter(k, a, front)
  redis.call(front and 'RPUSH' or 'LPUSH', k[1], a.message)
  pushed({k[3], k[4], a.due, a.wake}, k[1], a.message, a.entered)
  redis.call('SADD', k[2], k[1])
  if tonumber(a.rank) == 0 then tell_fast(k[5], a.news, k[1])
  elseif tonumber(a.rank) == 1 then tell_first(k[5], a.news, k[1], a.heavier) end
end
-- The run a job leads (hash ``run``, if it exists) takes the rank of the lane the job
-- is pushed to, unless it is slower already: callers join only runs waiting in a lane
-- as fast as their own tier (lua/claim.lua).
local function rank_run(run, rank)
  local held = redis.call('HGET', run, 'rank')
  if held and tonumber(held) < tonumber(rank) then redis.call('HSET', run, 'rank', rank) end
end
