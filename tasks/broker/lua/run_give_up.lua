-- KEYS: lease, run counter, dead letters, metrics, dead-letter index, the job's
-- prediction's record (its event log says it completed: lua/events.lua)[, the job's
-- result entry (Celery's backend)]. ARGV: token, run number, job id, dead letter, metric field,
-- when it failed (unix s, the index's score), how long letters are kept (s)[, the
-- FAILURE entry to store, how long entries are kept (s)].
-- A call retried after a lost reply finds its letter (first: the lease may have been
-- marked released meanwhile, by a put-back of a copy). The run counter is kept as long
-- as the letter: a copy that comes later finds it, so reads the letter (lua/run_begin).
-- The job's FAILURE entry is stored in the same step: its caller hears of the failure
-- even if Celery's own store of it, after the task, never succeeds.
-- include: holds
-- include: events
if redis.call('HEXISTS', KEYS[3], ARGV[3]) == 1 then return 1 end
if not holds(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then return 0 end
if KEYS[7] then redis.call('SET', KEYS[7], ARGV[8], 'EX', ARGV[9]) end
add_event(KEYS[6], 'completed', '{"state":"FAILURE"}')
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
redis.call('ZADD', KEYS[5], ARGV[6], ARGV[3])
redis.call('DEL', KEYS[1])
redis.call('EXPIRE', KEYS[2], ARGV[7])
redis.call('HINCRBY', KEYS[4], ARGV[5], 1)
return 1
