-- KEYS: beat's leader, beat's epoch. ARGV: this beat's identity, lease ms.
-- Take the lead when nobody holds it (a new epoch, one more than the last) or renew
-- one's own; returns the epoch led, 0 when another beat leads.
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
if holder then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return redis.call('INCR', KEYS[2])
