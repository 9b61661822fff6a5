-- A prediction's event log (tasks.jobs.events): a stream beside its record, ``record ..
-- ':events'``, that the HTTP front door relays to callers. ``record``: the record's key
-- (none: the job is not a prediction, nothing is logged); ``kind``: queued, started,
-- progress, completed; ``data``: its JSON. A completed success logs its output first.
-- Nothing is logged after completed, and started once (a resumed run does not start the
-- prediction again). The log keeps about its last 1,024 events, as long as the record.
-- A prediction with a webhook (its record's 'hook': the outbox, a sorted set of what is
-- due when) has each event its filter ('hook_kinds') takes put in the outbox, progress
-- at most every 'hook_gap' ms, and output only if completed (which shows it) is not
-- taken. Returns the event's id, or false.
local function log_event(log, kind, data)
  return redis.call('XADD', log, 'MAXLEN', '~', 1024, '*', 'kind', kind, 'data', data)
end

-- when an event is due in the outbox: at once, its log time (unix s)
local function due(id)
  return tonumber(string.match(id, '^[0-9]+')) / 1000
end

local function add_event(record, kind, data)
  local f = redis.call('HMGET', record, 'json', 'ended', 'began', 'hook', 'hook_kinds',
                       'hook_at', 'hook_gap')
  if not f[1] or f[2] or (kind == 'started' and f[3]) then return false end
  local log = record .. ':events'
  if kind == 'completed' and string.find(data, '"SUCCESS"', 1, true) then
    local out = log_event(log, 'output', '{}')  -- announced with completed, next
    if f[4] and string.find(f[5], 'output', 1, true)
        and not string.find(f[5], 'completed', 1, true) then
      redis.call('ZADD', f[4], due(out), record .. ' ' .. out .. ' output')
    end
  end
  local id = log_event(log, kind, data)
  redis.call('PUBLISH', log, id)
  local ttl = redis.call('TTL', record)
  if ttl > 0 then redis.call('EXPIRE', log, ttl) end
  if kind == 'completed' then redis.call('HSET', record, 'ended', id)
  elseif kind == 'started' then redis.call('HSET', record, 'began', id) end
  if f[4] and string.find(f[5], kind, 1, true) then
    local ms = due(id) * 1000
    if kind ~= 'progress' or ms - tonumber(f[6] or '0') >= tonumber(f[7] or '0') then
      if kind == 'progress' then redis.call('HSET', record, 'hook_at', ms) end
      redis.call('ZADD', f[4], due(id), record .. ' ' .. id .. ' ' .. kind)
    end
  end
  return id
end
