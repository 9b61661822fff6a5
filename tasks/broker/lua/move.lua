-- KEYS: source, target, ledger, the target lane's lists, the job's run (a coalesced run
-- it leads; absent if none)[, the account's fast places].
-- ARGV: message, rewritten, job id, delivery tag, the target lane's rank (0: fast).
-- The ledger follows the message (``tasks.broker.transport``); a run the job leads takes
-- the target lane's rank unless it is slower already: no caller joins a run whose
-- leader waits in a lane slower than the caller's own tier.
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[4], KEYS[2] .. '\n' .. ARGV[2])
redis.call('SADD', KEYS[4], KEYS[2])
local rank = redis.call('HGET', KEYS[5], 'rank')
if rank and tonumber(rank) < tonumber(ARGV[5]) then
  redis.call('HSET', KEYS[5], 'rank', ARGV[5])
end
if KEYS[6] then redis.call('ZREM', KEYS[6], ARGV[3]) end
return 1
