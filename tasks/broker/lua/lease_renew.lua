-- KEYS: (lease, run counter) per run. ARGV: lease ttl, then (token, run number) per run.
-- Extends each lease the run still holds, taking it again if it lapsed with no newer
-- run begun. Returns 1 or 0 per run.
-- include: holds
local held = {}
for k = 1, #KEYS, 2 do
  local token, n = ARGV[k + 1], ARGV[k + 2]
  local ok = holds(KEYS[k], KEYS[k + 1], token, n)
  if ok then redis.call('SET', KEYS[k], token, 'EX', ARGV[1]) end
  held[#held + 1] = ok and 1 or 0
end
return held
