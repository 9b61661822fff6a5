-- KEYS: source, target, ledger, the target lane's lists[, the account's fast places].
-- ARGV: message, rewritten, job id, delivery tag. The ledger follows the message
-- (``tasks.broker.transport``).
if redis.call('LREM', KEYS[1], -1, ARGV[1]) == 0 then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[4], KEYS[2] .. '\n' .. ARGV[2])
redis.call('SADD', KEYS[4], KEYS[2])
if KEYS[5] then redis.call('ZREM', KEYS[5], ARGV[3]) end
return 1
