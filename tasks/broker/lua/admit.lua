-- An account's plan limits (tasks.jobs.admission). ``held``: {its admitted jobs, its
-- admitted fast jobs} (sorted sets, each job scored by when it lapses). ``limits``: the
-- plan's {concurrent jobs, concurrent fast jobs, seconds an admission lapses after}.
-- A job is admitted to the lanes while the account has fewer than the concurrent jobs
-- admitted (queued there or running), and for a fast job fewer than the concurrent fast
-- ones; else it is parked in the account's own line (a list of "<list>\n<the lane's
-- lists>\n<job>\n<lane clock>\n<rank>\n<limits>\n<message>"), until one of its jobs is
-- over (lua/promote.lua).
-- (Reads count live members only: a publish's first write must be one Redis refuses
-- while out of memory, lua/fair.lua.)
local function live(key, now) return redis.call('ZCOUNT', key, '(' .. now, '+inf') end
local function has_room(held, fast, limits, now)
  if live(held[1], now) >= tonumber(limits[1]) then return false end
  return not fast or live(held[2], now) < tonumber(limits[2])
end
local function admit(held, job, fast, limits, now)
  local lapse = tonumber(limits[3])
  for i = 1, fast and 2 or 1 do
    redis.call('ZADD', held[i], now + lapse, job)
    redis.call('ZREMRANGEBYSCORE', held[i], '-inf', now)
    redis.call('EXPIRE', held[i], math.ceil(lapse) + 60)
  end
end
local function words(text)
  local found = {}
  for word in string.gmatch(text, '%S+') do found[#found + 1] = word end
  return found
end
-- A new job's admission by its plan ``spec`` ("concurrent concurrent_fast queued lapse_s"):
-- 'admitted', 'park' (its account's line has room), or 'queued_jobs' (it has none).
local function admission(held, line, spec, job, rank, now)
  local plan = words(spec)
  local limits, fast = {plan[1], plan[2], plan[4]}, tonumber(rank) == 0
  local waiting = redis.call('LLEN', line)
  if waiting == 0 and has_room(held, fast, limits, now) then
    admit(held, job, fast, limits, now)
    return 'admitted'
  end
  if waiting >= tonumber(plan[3]) then return 'queued_jobs' end
  return 'park'
end
local function park(line, accounts, account, list, lists, a)
  local plan = words(a.plan)
  local entry = table.concat({list, lists, a.job, a.entered, a.rank,
                              plan[1] .. ' ' .. plan[2] .. ' ' .. plan[4], a.message}, '\n')
  if redis.call('LINDEX', line, -1) ~= entry then redis.call('RPUSH', line, entry) end
  redis.call('SADD', accounts, account)
end
local function parked_entry(entry)
  local p = {}
  for i = 1, 6 do
    local at = string.find(entry, '\n', 1, true)
    p[i], entry = string.sub(entry, 1, at - 1), string.sub(entry, at + 1)
  end
  return {list = p[1], lists = p[2], job = p[3], entered = p[4], rank = p[5],
          limits = words(p[6]), message = entry}
end
