-- KEYS: lease, run counter, done, the job's result entry (Celery's backend), fast
-- balances, exhausted, the holding process's records, the job's prediction's record (its
-- event log says it completed: lua/events.lua)[, the coalesced run the job leads, the
-- cache's LRU set]. ARGV: token, run number, result, result ttl, account, run s,
-- starting fast balance ('': no fast time to charge), the SUCCESS entry to store and
-- announce ('': none), the take token of the run's message to ack here ('': acked
-- apart), lease ttl[, then the settle's: leader id, cache ttl, max entries, now, seconds
-- a settled run is kept, token (lua/settle)].
-- A call retried after a lost reply finds its own result ('earlier') and counts
-- nothing twice. A run that still holds its job also acks its message here: its
-- records go with the lease in one step, so a worker that dies after it has nothing
-- left to put back. A run others joined is closed to joiners (its result cached if
-- admitted) in the same step as its entry is announced: the followers come after the
-- verdict and its value, for the worker to serve.
-- include: add_fast
-- include: settle
-- include: events
local lease = redis.call('GETDEL', KEYS[1])
if lease then
  if lease ~= ARGV[1] then  -- a newer run's: it stays
    redis.call('SET', KEYS[1], lease, 'EX', ARGV[10])
    return {'stale', ''}
  end
elseif tonumber(redis.call('GET', KEYS[2]) or '0') ~= tonumber(ARGV[2]) then
  return {'stale', ''}  -- lapsed, and a newer run began
end
if ARGV[9] ~= '' then redis.call('HDEL', KEYS[7], ARGV[9]) end
local answer = {'stored', ''}
if not redis.call('SET', KEYS[3], ARGV[3], 'EX', ARGV[4], 'NX') then
  answer = {'earlier', redis.call('GET', KEYS[3])}
end
if KEYS[9] then  -- settled once: a retried call (or a later run) gets what it got
  local result = answer[1] == 'stored' and ARGV[3] or answer[2]
  local followers = settle(KEYS[9], KEYS[10], ARGV[11], result, ARGV[12], ARGV[13],
                           ARGV[14], ARGV[15], ARGV[16])
  for i = 1, #followers do answer[#answer + 1] = followers[i] end
end
if answer[1] == 'earlier' then return answer end
add_event(KEYS[8], 'completed', '{"state":"SUCCESS"}')
if ARGV[8] ~= '' then
  redis.call('SET', KEYS[4], ARGV[8], 'EX', ARGV[4])
  redis.call('PUBLISH', KEYS[4], ARGV[8])
end
if ARGV[7] ~= '' then add(KEYS[5], KEYS[6], ARGV[5], -tonumber(ARGV[6]), ARGV[7]) end
return answer
