-- A new job's publish (tasks.broker.publish.publish): every condition its publisher
-- set is checked, then its message is pushed, in one step. A refusal writes nothing
-- and is returned by name; else 'pushed' (with the job's place, when asked).
-- KEYS: the list, the lane's lists, depths per lane, depths per list, preemptible runs;
-- then, '' where unused: the account's fast places, the result-cache run the job leads
-- (its pointer, its hash), the fast-time balances, the cache's entry, LRU set, metrics;
-- the idempotency key, the prediction's record, the account's predictions; the account's
-- admitted jobs, admitted fast jobs, parked jobs, the accounts with parked jobs; the
-- fast periods, the exhausted accounts; the account's jobs waiting in the lane, the
-- queue's list at each level, the lane's accounts with jobs waiting (lua/fair.lua).
-- ARGV: the message, then name/value pairs: job, entered, rank, due, wake, news
-- (lua/enter.lua); and those of the conditions set:
--   deadline   Redis' unix s past which the publish comes too late ('late')
--   claim_*    claim the job's digest first (lua/claim.lua): a stored result, a run to
--              follow or one being claimed is answered ({verdict, value}), nothing pushed
--   account, balance   the account's fast time, refused at or below 0 ('fast_time');
--              balance: an uncharged account's
--   limits     depth limits (lua/limits.lua), refused by their names ('full',
--              'over_budget'; 'full_level', 'over_level' for a job at a later level than
--              the first)
--   places, lapse      the account's fast places (lua/places.lua)
--   ttl        the seconds a confirmed run lives: the publish confirms the run it leads
--   same_s     an idempotency key held that long: found taken, answered {'same', job}
--   record, record_s, kept   the prediction's record (JSON), kept record_s, and its
--              place in the account's predictions, of which the latest ``kept`` stay
--   lane       the lane the job goes to (written into the record)
--   hook       "outbox kinds gap_ms" of the prediction's webhook (lua/record.lua)
--   plan       "concurrent concurrent_fast queued lapse_s" (lua/admit.lua): over the
--              first two the job is parked ('parked'); more than queued parked: refused
--              ('queued_jobs')
--   fair       "level lane min ratio ratio ratio lapse_s" (lua/fair.lua): the job enters the list
--              of its level, raised by its account's jobs waiting in the lane; its
--              admission counts what waits at its level or before (fair_steps: the
--              levels' priority steps), and its maximum depth the share of it its level
--              may fill (fair_room: one per level)
--   period     "index period_s fast_s" of the plan's fast time: another period (a plan
--              changed within one does not renew) renews the balance to its fast_s
--   placed     answer a pushed job with its place: {'pushed', the jobs of its lane that
--              entered before it} (-1: not kept, in relaxed's first level)
-- include: named
-- include: enter
-- include: claim
-- include: limits
-- include: places
-- include: admit
-- include: record
-- include: fair
local k, a = KEYS, named(ARGV, 2)
local places, pointer, run, balances = k[6], k[7], k[8], k[9]
a.message = ARGV[1]
if already(k, a, false) then return 'pushed' end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
if a.deadline and now > tonumber(a.deadline) then return 'late' end
local level
if a.fair then
  if redis.call('ZSCORE', k[22], a.job) then return 'pushed' end  -- sent again
  level = fair_level(k[22], k[27], k[3], a.fair, a.account, now)
  k[1] = k[23 + level]
end
if k[13] ~= '' then
  local same = redis.call('GET', k[13])
  if same then return {'same', same} end
end
if k[10] ~= '' then
  local answer = claim_run({k[10], k[11], pointer, run, k[12]},
                           {a.job, a.claim_admit, a.claim_follower, a.claim_now, a.claim_rank,
                            a.claim_s, a.claim_runs})
  if answer[1] ~= 'lead' then return answer end
end
local function period_of(text) return text and string.match(text, '^%S+ %S+') end
if a.period and period_of(redis.call('HGET', k[20], a.account)) ~= period_of(a.period) then
  redis.call('HSET', balances, a.account, a.balance)
  redis.call('HSET', k[20], a.account, a.period)
  redis.call('SREM', k[21], a.account)
end
if balances ~= '' and tonumber(redis.call('HGET', balances, a.account) or a.balance) <= 0 then
  return 'fast_time'
end
local over = limit_reached(k, a.limits,
                           level and ahead_of(string.match(a.fair, '^%S+ (%S+)'), level,
                                              a.fair_steps, a.fair_room))
-- a limit that refuses a job at a later level may still let in those before it
if level and level > 0 and over then return over == 'full' and 'full_level' or 'over_level' end
if over then return over end
if places ~= '' then
  local refused = take_place(places, tonumber(a.places), tonumber(a.lapse), a.job, now)
  if refused then return refused end
end
local admitted = a.plan and admission({k[16], k[17]}, k[18], a.plan, a.job, a.rank, now)
if admitted == 'queued_jobs' then return admitted end
if level then join_fair(k[22], k[27], a.account, a.fair, a.job, now) end
if k[13] ~= '' then redis.call('SET', k[13], a.job, 'EX', a.same_s) end
if k[14] ~= '' then record({k[14], k[15]}, a, admitted == 'park', now) end
if admitted == 'park' then
  park(k[18], k[19], a.account, k[1], k[2], a)
  return 'parked'
end
if pointer ~= '' and redis.call('GET', pointer) == a.job then
  redis.call('EXPIRE', pointer, a.ttl)
  redis.call('HSET', run, 'confirmed', '1')
  redis.call('EXPIRE', run, a.ttl)
end
if run ~= '' then rank_run(run, a.rank) end
enter(k, a, false)
if a.placed then
  local ahead = -1
  if tonumber(a.entered) > 0 then
    ahead = redis.call('ZCOUNT', a.due .. lane_of(k[1]), '-inf', '(' .. a.entered)
  end
  return {'pushed', ahead}
end
return 'pushed'
