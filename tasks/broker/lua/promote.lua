-- KEYS: the account's admitted jobs, its admitted fast jobs, its parked jobs, the
-- accounts with parked jobs, depths per lane, depths per list, preemptible runs.
-- ARGV: the account, the due, wake and fast-news prefixes, the least score of a run a
-- first-level standard job is told to (lua/fast_news.lua), then its jobs that are over.
-- An account's jobs are over (tasks.jobs.admission): they leave the admitted sets, and
-- the account's parked jobs enter their lists, first parked first, while its plan has
-- room for them. Returns how many entered.
-- include: enter
-- include: admit
local held = {KEYS[1], KEYS[2]}
for i = 6, #ARGV do
  redis.call('ZREM', KEYS[1], ARGV[i])
  redis.call('ZREM', KEYS[2], ARGV[i])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local entered = 0
while true do
  local head = redis.call('LINDEX', KEYS[3], 0)
  if not head then
    redis.call('SREM', KEYS[4], ARGV[1])
    break
  end
  local p = parked_entry(head)
  local fast = tonumber(p.rank) == 0
  if not has_room(held, fast, p.limits, now) then break end
  redis.call('LPOP', KEYS[3])
  admit(held, p.job, fast, p.limits, now)
  -- it enters its lane now: its wait there counts from now, not from when it was parked
  enter({p.list, p.lists, KEYS[5], KEYS[6], KEYS[7]},
        {message = p.message, entered = tonumber(p.entered) > 0 and now or 0,
         rank = p.rank, due = ARGV[2], wake = ARGV[3], news = ARGV[4], heavier = ARGV[5]},
        false)
  entered = entered + 1
end
return entered
