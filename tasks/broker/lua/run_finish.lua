-- KEYS: lease, run counter, done, usage bucket, metrics[, fast balances, exhausted].
-- ARGV: token, run number, result, result ttl, account, run s, usage ttl, starting fast
-- balance, then (metric field, amount) pairs. A call retried after a lost reply finds
-- its own result ('earlier') and counts nothing twice.
-- include: holds
-- include: add_fast
if not holds(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return {'stale', ''} end
local earlier = redis.call('GET', KEYS[3])
redis.call('DEL', KEYS[1])
if earlier then return {'earlier', earlier} end
redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[4])
redis.call('HINCRBYFLOAT', KEYS[4], ARGV[5], ARGV[6])
redis.call('EXPIRE', KEYS[4], ARGV[7])
for i = 9, #ARGV, 2 do redis.call('HINCRBYFLOAT', KEYS[5], ARGV[i], ARGV[i + 1]) end
if KEYS[6] then add(KEYS[6], KEYS[7], ARGV[5], -tonumber(ARGV[6]), ARGV[8]) end
return {'stored', ''}
