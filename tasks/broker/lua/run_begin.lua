-- KEYS: done, lease, run counter, revoked set, dead letters, holders[, the account's
-- fast places]. ARGV: holder, lease ttl, counter ttl, job id, delivery tag, '1' for a
-- copy deferred earlier (it steps aside from a released lease: another copy exists),
-- the prefix of a released lease.
-- The lease is "<holder>#<run number>#<delivery tag>"; one marked released is free.
-- A call retried after a lost reply finds its own lease and carries on as that run.
-- A lease held by another run: 'busy' while that run's own message is recorded as
-- held (it comes back if that run dies), else 'defer': this copy may be the last one.
if KEYS[7] then redis.call('ZREM', KEYS[7], ARGV[4]) end
local done = redis.call('GET', KEYS[1])
if done then return {'done', done} end
local letter = redis.call('HGET', KEYS[5], ARGV[4])
if letter then return {'dead', letter} end
if redis.call('ZSCORE', KEYS[4], ARGV[4]) then return {'revoked', ''} end
local lease = redis.call('GET', KEYS[2])
local released = lease and string.sub(lease, 1, #ARGV[7]) == ARGV[7]
if released and ARGV[6] == '1' then return {'superseded', ''} end
if lease and not released then
  local head, tail = ARGV[1] .. '#', '#' .. ARGV[5]
  if ARGV[5] ~= '' and string.sub(lease, 1, #head) == head
      and string.sub(lease, -#tail) == tail then
    return {'run', string.sub(lease, #head + 1, -#tail - 1)}
  end
  local twin = string.match(lease, '#([^#]*)$')
  if twin and twin ~= '' and redis.call('HEXISTS', KEYS[6], twin) == 1 then
    return {'busy', ''}
  end
  return {'defer', ''}
end
local n = redis.call('INCR', KEYS[3])
redis.call('EXPIRE', KEYS[3], ARGV[3])
redis.call('SET', KEYS[2], ARGV[1] .. '#' .. n .. '#' .. ARGV[5], 'EX', ARGV[2])
return {'run', tostring(n)}
