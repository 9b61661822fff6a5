-- A run's next copy of its job (tasks.broker.publish.publish_copy: a retry, or a job
-- that stepped aside for a fast one), pushed only while that run still holds the job
-- (lua/holds.lua), its lease marked released in the same step: the run can never take
-- the job again, and the copy's run begins as if it were free. Returns 'pushed', or
-- 'fence' having written nothing (a newer run holds the job, or this very publish went
-- through before and its answer was lost).
-- KEYS: the list, the lane's lists, depths per lane, depths per list, preemptible runs,
-- the job's lease, its run counter, the run it leads (if it leads one).
-- ARGV: the message, then name/value pairs: job, entered, rank, due, wake, news
-- (lua/enter.lua); token and run (the run's lease and number), released (the prefix of
-- a released lease) and kept_s (how long it is kept), front ('1': taken next).
-- include: named
-- include: holds
-- include: enter
local k, a = KEYS, named(ARGV, 2)
a.message = ARGV[1]
local front = a.front == '1'
if already(k, a, front) then return 'pushed' end
if not holds(k[6], k[7], a.token, a.run) then return 'fence' end
rank_run(k[8], a.rank)
redis.call('SET', k[6], a.released .. a.run, 'EX', a.kept_s)
enter(k, a, front)
return 'pushed'
