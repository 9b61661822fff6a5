-- A job leaves its account's jobs waiting in a fast or standard lane (lua/fair.lua): it
-- started, moved to another lane, or was revoked. ``set``: the account's sorted set of
-- them; ``accounts``: the lane's accounts with jobs waiting, which the account leaves
-- with its last one (what has lapsed does not count).
local function leave_fair(set, accounts, account, job)
  if redis.call('ZREM', set, job) == 0 then return end  -- not counted there: nothing more
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
  if redis.call('ZCOUNT', set, '(' .. now, '+inf') == 0 then
    redis.call('SREM', accounts, account)
  end
end
