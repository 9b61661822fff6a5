-- KEYS: kombu's unacked index, then (lease, run counter) per run. ARGV: now, lease
-- ttl, the number of delivery tags, the tags, then (token, run number) per run.
-- Dates each held message from now (XX: an acked one stays gone) and extends each
-- lease the run still holds, taking it again if it lapsed with no newer run begun.
-- Returns 1 or 0 per run.
-- include: holds
local tags = tonumber(ARGV[3])
for i = 4, 3 + tags do redis.call('ZADD', KEYS[1], 'XX', ARGV[1], ARGV[i]) end
local held = {}
for k = 2, #KEYS, 2 do
  local token, n = ARGV[3 + tags + k - 1], ARGV[3 + tags + k]
  local ok = holds(KEYS[k], KEYS[k + 1], token, n)
  if ok then redis.call('SET', KEYS[k], token, 'EX', ARGV[2]) end
  held[#held + 1] = ok and 1 or 0
end
return held
