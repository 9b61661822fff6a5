-- KEYS: fast balances, fast periods, exhausted accounts. ARGV: the account, its period
-- as read ("index period_s fast_s"), the new one.
-- A plan's account whose fast time was spent gets its period's fast seconds back when
-- a new period began, unless a publish renewed it meanwhile. Returns 1 if renewed.
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
local fast_s = string.match(ARGV[3], '(%S+)$')
redis.call('HSET', KEYS[1], ARGV[1], fast_s)
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('SREM', KEYS[3], ARGV[1])
return 1
