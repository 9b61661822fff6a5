-- KEYS: lease, run counter, done, usage bucket, the job's result entry (Celery's
-- backend)[, fast balances, exhausted]. ARGV: token, run number, result, result ttl,
-- account, run s, usage ttl, starting fast balance, the SUCCESS entry to store and
-- announce ('': none). A call retried after a lost reply finds its own result
-- ('earlier') and counts nothing twice.
-- include: holds
-- include: add_fast
if not holds(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return {'stale', ''} end
redis.call('DEL', KEYS[1])
if not redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[4], 'NX') then
  return {'earlier', redis.call('GET', KEYS[3])}
end
if ARGV[9] ~= '' then
  redis.call('SET', KEYS[5], ARGV[9], 'EX', ARGV[4])
  redis.call('PUBLISH', KEYS[5], ARGV[9])
end
-- a bucket's field is new when the sum is what this run adds: its expiry is set once
local used = redis.call('HINCRBYFLOAT', KEYS[4], ARGV[5], ARGV[6])
if tonumber(used) == tonumber(ARGV[6]) then redis.call('EXPIRE', KEYS[4], ARGV[7]) end
if KEYS[6] then add(KEYS[6], KEYS[7], ARGV[5], -tonumber(ARGV[6]), ARGV[8]) end
return {'stored', ''}
