-- The level a new job enters a fast or standard lane at (routing.fair.fair_level):
-- its account's recent usage level, raised by its jobs already waiting in the lane
-- against the other accounts' there (routing.fair.queued_level). ``set``: sorted set
-- of its jobs, each lapsing at its score (in fast, the account's fast places);
-- ``accounts``: the lane's accounts with jobs waiting; ``depths``: the depths per lane;
-- ``spec``: "level lane min ratio ratio ratio lapse_s".
local function fair_level(set, accounts, depths, spec, account, now)
  local w = {}
  for word in string.gmatch(spec, '%S+') do w[#w + 1] = word end
  local waiting, level = redis.call('ZCOUNT', set, '(' .. now, '+inf'), tonumber(w[1])
  if waiting < tonumber(w[3]) then return level end
  local depth = tonumber(redis.call('HGET', depths, w[2]) or '0')
  local others = redis.call('SCARD', accounts) - redis.call('SISMEMBER', accounts, account)
  local ratio = waiting / (math.max(depth - waiting, 0) / math.max(others, 1) + 1)
  for i = 4, #w - 1 do
    if ratio >= tonumber(w[i]) and i - 3 > level then level = i - 3 end
  end
  return level
end
-- What a job entering ``lane`` at ``level`` has ahead of it there (lua/limits.lua): the
-- lane's first step (jobs the load moved there) and its levels up to its own, whose
-- priority steps ``steps`` gives ("1 3 6 9"); and the share of the lane's maximum
-- depth its level may fill (``rooms``: one per level).
local function ahead_of(lane, level, steps, rooms)
  local fields, i = {lane .. '@0'}, 0
  for step in string.gmatch(steps, '%S+') do
    if i > level then break end
    fields[#fields + 1] = lane .. '@' .. step
    i = i + 1
  end
  local room, j = 1, 0
  for share in string.gmatch(rooms, '%S+') do
    if j == level then room = tonumber(share) end
    j = j + 1
  end
  return {lane, fields, room}
end
-- The job waits in the lane: it counts for its account's next jobs there until it starts
-- (lua/run_begin.lua), leaves the lane (lua/move.lua) or lapses.
-- Reads count the live members only: the first write of a publish must be one Redis
-- refuses while out of memory (ZADD, LPUSH), for it to refuse the whole publish.
local function join_fair(set, accounts, account, spec, job, now)
  local lapse = tonumber(string.match(spec, '(%S+)$'))
  redis.call('ZADD', set, now + lapse, job)
  redis.call('SADD', accounts, account)
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
  redis.call('EXPIRE', set, math.ceil(lapse) + 60)
end
