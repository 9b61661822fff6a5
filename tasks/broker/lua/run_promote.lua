-- KEYS: the revoked leader's run. ARGV: its id, run key prefix, ttl s, seconds the
-- heir's unpublished claim lives.
-- The heir is the follower of the fastest tier (a tie: any); the run takes its tier's
-- rank until the heir's publish gives it its lane's. The run is provisional again, as
-- a fresh claim is: nobody joins it before that publish confirms it (``publish.lua``), so
-- no caller joins a run its heir then sends to a slower lane.
-- Returns {heir id, heir JSON, the run's pointer}, or nil when no follower is left.
local run = redis.call('HGETALL', KEYS[1])
if #run == 0 or redis.call('HEXISTS', KEYS[1], 'settled') == 1 then return false end
redis.call('DEL', KEYS[1])
local heir, job, best, pointer = nil, nil, nil, nil
for i = 1, #run, 2 do
  if string.sub(run[i], 1, 2) == 'f:' then
    local rank = cjson.decode(run[i + 1])['rank']
    if best == nil or rank < best then heir, job, best = string.sub(run[i], 3), run[i + 1], rank end
  elseif run[i] == 'pointer' then pointer = run[i + 1] end
end
local ours = redis.call('GET', pointer) == ARGV[1]
if heir == nil then
  if ours then redis.call('DEL', pointer) end
  return false
end
local rest = {'rank', tostring(best)}
for i = 1, #run, 2 do
  if run[i] ~= 'rank' and run[i] ~= 'confirmed' and run[i] ~= 'f:' .. heir then
    rest[#rest + 1] = run[i]
    rest[#rest + 1] = run[i + 1]
  end
end
redis.call('HSET', ARGV[2] .. heir, unpack(rest))
redis.call('EXPIRE', ARGV[2] .. heir, ARGV[3])
if ours then redis.call('SET', pointer, heir, 'EX', ARGV[4]) end
return {heir, job, pointer}
