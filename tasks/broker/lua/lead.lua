-- KEYS: beat's leader, beat's epoch. ARGV: this beat's identity, lease ms, the highest
-- epoch this beat has seen (its floor).
-- Take the lead when nobody holds it, or renew one's own. Returns {the epoch led (0:
-- another beat leads), the current epoch}. A new lead takes one more than both the
-- epoch key and the floor: an epoch key lost (a flush, a restore) never hands out an
-- epoch again. A leader whose epoch key is gone or behind its own leads on under a new one.
local holder = redis.call('GET', KEYS[1])
local epoch, floor = tonumber(redis.call('GET', KEYS[2]) or '0'), tonumber(ARGV[3])
if holder and holder ~= ARGV[1] then return {0, epoch} end
if holder == ARGV[1] and epoch >= floor and epoch > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {epoch, epoch}
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
epoch = math.max(epoch, floor) + 1
redis.call('SET', KEYS[2], epoch)
return {epoch, epoch}
