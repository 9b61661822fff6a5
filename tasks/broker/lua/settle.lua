-- ``settle(run, lru, leader id, result JSON ('' = no admission), ttl s, max entries, now,
-- seconds a settled run is kept, token)``: close the run led by ``leader`` to joiners
-- (admitting ``result`` to the cache if it earned it); its followers as id, JSON, id,
-- JSON... A settled run is kept a while, marked with the token that settled it (one per
-- outcome: the same for a call retried after a lost reply, another for another caller):
-- a call retried gets the same followers again (writing their results twice is
-- harmless), any other settle gets none (a failed run's followers are failed once, a
-- finished run's never failed after), and nothing else happens twice (no admission
-- twice, no promotion of a finished run).
local function settle(run_key, lru, leader, result, ttl, max, now, kept, token)
  local run = redis.call('HGETALL', run_key)
  if #run == 0 then return {} end
  local meta, followers = {}, {}
  for i = 1, #run, 2 do
    if string.sub(run[i], 1, 2) == 'f:' then
      followers[#followers + 1] = string.sub(run[i], 3)
      followers[#followers + 1] = run[i + 1]
    else meta[run[i]] = run[i + 1] end
  end
  if meta.settled then
    if meta.settled == token then return followers end
    return {}
  end
  redis.call('HSET', run_key, 'settled', token)
  redis.call('EXPIRE', run_key, kept)
  if redis.call('GET', meta.pointer) == leader then redis.call('DEL', meta.pointer) end
  if result ~= '' and meta.admit == '1' then
    redis.call('SET', meta.entry, result, 'EX', ttl)
    redis.call('ZADD', lru, now, meta.entry)
    redis.call('ZREMRANGEBYSCORE', lru, '-inf', '(' .. (tonumber(now) - tonumber(ttl)))
    local over = redis.call('ZCARD', lru) - tonumber(max)
    if over > 0 then
      local gone = redis.call('ZPOPMIN', lru, over)
      for i = 1, #gone, 2 do redis.call('DEL', gone[i]) end
    end
  end
  return followers
end
