-- KEYS: source, target, ledger, depths per lane, depths per list, beat's epoch, the
-- target lane's lists, the job's run (a coalesced run it leads; absent if none)[, the
-- account's fast places].
-- ARGV: message, rewritten, job id, delivery tag, the target lane's rank (0: fast), the
-- rewritten job's lane clock (0: not indexed), due prefix, beat's epoch ('' : not beat),
-- '1' to push it at the back of the target (taken after what is there), else the front.
-- The ledger follows the message (``tasks.broker.transport``) with its depths and due
-- index; a run the job leads takes the target lane's rank unless it is slower already:
-- no caller joins a run whose leader waits in a lane slower than the caller's own tier.
-- include: ledger
-- include: fence
if not leads(KEYS[6], ARGV[8]) then return 0 end
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return 0 end
redis.call(ARGV[9] == '1' and 'LPUSH' or 'RPUSH', KEYS[2], ARGV[2])
local book = {KEYS[3], KEYS[4], KEYS[5], ARGV[7]}
ledger_drop(book, ARGV[4])
ledger_add(book, ARGV[4], KEYS[2], ARGV[2], ARGV[6])
redis.call('SADD', KEYS[7], KEYS[2])
local rank = redis.call('HGET', KEYS[8], 'rank')
if rank and tonumber(rank) < tonumber(ARGV[5]) then
  redis.call('HSET', KEYS[8], 'rank', ARGV[5])
end
if KEYS[9] then redis.call('ZREM', KEYS[9], ARGV[3]) end
return 1
