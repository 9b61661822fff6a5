-- KEYS: the run, the LRU set. ARGV: leader id, result JSON ('' = no admission), ttl s,
-- max entries, now, seconds a settled run is kept, the settle's token (one per outcome:
-- the same for a call retried after a lost reply, another for another caller).
-- Returns the followers as id, JSON, id, JSON... A settled run is kept a while, marked
-- with the token that settled it: a call retried after a lost reply gets the same
-- followers again (writing their results twice is harmless), any other settle gets none
-- (a failed run's followers are failed once, a finished run's never failed after), and
-- nothing else happens twice (no admission twice, no promotion of a finished run).
local run = redis.call('HGETALL', KEYS[1])
if #run == 0 then return {} end
local meta, followers = {}, {}
for i = 1, #run, 2 do
  if string.sub(run[i], 1, 2) == 'f:' then
    followers[#followers + 1] = string.sub(run[i], 3)
    followers[#followers + 1] = run[i + 1]
  else meta[run[i]] = run[i + 1] end
end
if meta.settled then
  if meta.settled == ARGV[7] then return followers end
  return {}
end
redis.call('HSET', KEYS[1], 'settled', ARGV[7])
redis.call('EXPIRE', KEYS[1], ARGV[6])
if redis.call('GET', meta.pointer) == ARGV[1] then redis.call('DEL', meta.pointer) end
if ARGV[2] ~= '' and meta.admit == '1' then
  redis.call('SET', meta.entry, ARGV[2], 'EX', ARGV[3])
  redis.call('ZADD', KEYS[2], ARGV[5], meta.entry)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. (tonumber(ARGV[5]) - tonumber(ARGV[3])))
  local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
  if over > 0 then
    local gone = redis.call('ZPOPMIN', KEYS[2], over)
    for i = 1, #gone, 2 do redis.call('DEL', gone[i]) end
  end
end
return followers
