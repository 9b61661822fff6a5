-- KEYS: source, target, depths per lane, depths per list, beat's epoch, the target lane's
-- lists, the job's run (a coalesced run it leads; absent if none)[, the account's jobs
-- waiting in the lane it leaves (its fast places in fast), and that lane's accounts
-- with jobs waiting].
-- ARGV: message, rewritten, job id, the wake prefix (keys.wake_key), the target lane's rank
-- (0: fast), the rewritten job's lane clock (0: not indexed), due prefix, beat's epoch
-- ('' : not beat), '1' to push it at the back of the target (taken after what is there),
-- else the front[, the job's account].
-- The message leaves its list only if it is still there (a worker may have taken it),
-- its count and due index entry following it (lua/queue.lua); a run the job leads takes
-- the target lane's rank unless it is slower already: no caller joins a run whose
-- leader waits in a lane slower than the caller's own tier.
-- include: queue
-- include: fence
-- include: leave
if not leads(KEYS[5], ARGV[8]) then return 0 end
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return 0 end
redis.call(ARGV[9] == '1' and 'LPUSH' or 'RPUSH', KEYS[2], ARGV[2])
local book = {KEYS[3], KEYS[4], ARGV[7], ARGV[4]}
popped(book, KEYS[1], ARGV[1], true)
pushed(book, KEYS[2], ARGV[2], ARGV[6])
redis.call('SADD', KEYS[6], KEYS[2])
local rank = redis.call('HGET', KEYS[7], 'rank')
if rank and tonumber(rank) < tonumber(ARGV[5]) then
  redis.call('HSET', KEYS[7], 'rank', ARGV[5])
end
if KEYS[8] then leave_fair(KEYS[8], KEYS[9], ARGV[10], ARGV[3]) end
return 1
