-- KEYS: the webhook deliveries due, the attempts made of each. ARGV: the delivery, the
-- lease it was taken with, what became of it: 'done' (delivered, or dropped), 'again'
-- (failed: due again at ARGV[4], its attempt counted) or 'later' (not tried: due again
-- at ARGV[4]). A delivery another sender took meanwhile (its lease lapsed) is left to
-- that one. Returns 1 when settled, 0 when left.
local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not at or tonumber(at) ~= tonumber(ARGV[2]) then return 0 end
local field = string.match(ARGV[1], '^[^ ]+ [^ ]+')
if ARGV[3] == 'done' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], field)
  return 1
end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[1])
if ARGV[3] == 'again' then redis.call('HINCRBY', KEYS[2], field, 1) end
return 1
