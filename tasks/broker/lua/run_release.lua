-- KEYS: lease, run counter[, fast balances, exhausted].
-- ARGV: token, run number[, account, fast seconds it ran, starting fast balance].
-- A run that still holds its job drops the lease and, for a fast job stopped while it
-- ran (revoked), charges the account the seconds it ran, in the same step.
-- include: holds
-- include: add_fast
if holds(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then
  redis.call('DEL', KEYS[1])
  if KEYS[3] then add(KEYS[3], KEYS[4], ARGV[3], -tonumber(ARGV[4]), ARGV[5]) end
end
