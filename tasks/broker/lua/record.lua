-- A prediction's record, written in the step that publishes its job (tasks.jobs.predictions):
-- ``keys``: {the record, the account's predictions}; ``a``: the named ARGV (record: its
-- JSON, record_s: kept that long, kept: how many of the account's latest stay listed,
-- lane, entered: its lane clock; hook: "outbox kinds gap_ms" of its webhook, if any).
-- Its event log begins with 'queued' (lua/events.lua).
-- include: events
local function record(keys, a, parked, now)
  redis.call('HSET', keys[1], 'json', a.record, 'lane', a.lane, 'entered', a.entered,
             'parked', parked and '1' or '0')
  if a.hook then
    local outbox, kinds, gap = string.match(a.hook, '^([^ ]+) ([^ ]+) ([^ ]+)$')
    redis.call('HSET', keys[1], 'hook', outbox, 'hook_kinds', kinds, 'hook_gap', gap)
  end
  redis.call('EXPIRE', keys[1], a.record_s)
  redis.call('ZADD', keys[2], now, a.job)
  redis.call('ZREMRANGEBYRANK', keys[2], 0, -tonumber(a.kept) - 1)
  redis.call('EXPIRE', keys[2], a.record_s)
  -- a new log: nothing to check first, no reader to wake, no webhook takes 'queued'
  local log = keys[1] .. ':events'
  log_event(log, 'queued', cjson.encode({lane = a.lane, parked = parked}))
  redis.call('EXPIRE', log, a.record_s)
end
