-- A prediction's record, written in the step that publishes its job (tasks.jobs.predictions):
-- ``keys``: {the record, the account's predictions}; ``a``: the named ARGV (record: its
-- JSON, record_s: kept that long, kept: how many of the account's latest stay listed,
-- lane, entered: its lane clock).
local function record(keys, a, parked, now)
  redis.call('HSET', keys[1], 'json', a.record, 'lane', a.lane, 'entered', a.entered,
             'parked', parked and '1' or '0')
  redis.call('EXPIRE', keys[1], a.record_s)
  redis.call('ZADD', keys[2], now, a.job)
  redis.call('ZREMRANGEBYRANK', keys[2], 0, -tonumber(a.kept) - 1)
  redis.call('EXPIRE', keys[2], a.record_s)
end
