-- KEYS: done, lease, run counter, the job's revoked mark, dead letters, the job's result
-- entry (Celery's backend)[, per lane that keeps them, the account's jobs waiting there
-- (lua/fair.lua; in fast, its fast places) and the lane's accounts with jobs waiting].
-- ARGV: holder, lease ttl,
-- counter ttl, job id, the take token of the run's message, '1' for a copy deferred
-- earlier (it steps aside from a lease its run released by publishing the job's next
-- copy: that copy exists; not from one released as a held copy was put back, which may
-- have been this very copy), the prefix of a
-- released lease, the STARTED entry to store for a run that begins ('': none), how long
-- entries are kept, the holders' records' key prefix, the job's account, its prediction's
-- record (its event log says it started: lua/events.lua).
-- The lease is "<holder>#<run number>#<take token>"; one marked released is free.
-- A call retried after a lost reply finds its own lease and carries on as that run.
-- A lease held by another run: 'busy' while that run's own message is recorded as
-- held (it comes back if that run dies), else 'defer': this copy may be the last one.
-- A job with no run counter never ran, so has no dead letter of a run (a refused
-- message's letter has no valid copy): only a later run reads the letters.
-- include: leave
-- include: events
for i = 7, #KEYS, 2 do leave_fair(KEYS[i], KEYS[i + 1], ARGV[11], ARGV[4]) end
local found = redis.call('MGET', KEYS[1], KEYS[2], KEYS[4], KEYS[3])
local done, lease, ran = found[1], found[2], found[4]
if done then return {'done', done} end
if ran then
  local letter = redis.call('HGET', KEYS[5], ARGV[4])
  if letter then return {'dead', letter} end
end
if found[3] then return {'revoked', ''} end
local released = lease and string.sub(lease, 1, #ARGV[7]) == ARGV[7]
if released and ARGV[6] == '1' and lease ~= ARGV[7] .. 'put-back' then
  return {'superseded', ''}
end
if lease and not released then
  local head, tail = ARGV[1] .. '#', '#' .. ARGV[5]
  if ARGV[5] ~= '' and string.sub(lease, 1, #head) == head
      and string.sub(lease, -#tail) == tail then
    return {'run', string.sub(lease, #head + 1, -#tail - 1)}
  end
  local who, twin = string.match(lease, '^(.*)#[^#]*#([^#]*)$')
  if twin and twin ~= '' and redis.call('HEXISTS', ARGV[10] .. who, twin) == 1 then
    return {'busy', ''}
  end
  return {'defer', ''}
end
-- a job's first run sets its counter in one write; a later one counts up and keeps it
local n = 1
if ran then
  n = redis.call('INCR', KEYS[3])
  redis.call('EXPIRE', KEYS[3], ARGV[3])
else
  redis.call('SET', KEYS[3], 1, 'EX', ARGV[3])
end
redis.call('SET', KEYS[2], ARGV[1] .. '#' .. n .. '#' .. ARGV[5], 'EX', ARGV[2])
if ARGV[8] ~= '' then redis.call('SET', KEYS[6], ARGV[8], 'EX', ARGV[9]) end
add_event(ARGV[12], 'started', '{}')
return {'run', tostring(n)}
