-- KEYS: the webhook deliveries due (tasks.front.hooks), the attempts made of each.
-- ARGV: now (unix s), the lease's end (unix s), the most to take. Takes the deliveries
-- due by now, oldest first, each scored at the lease's end: a sender that dies with one
-- leaves it due again then. Returns each with the attempts made of it before.
local taken = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
local answer = {}
for i = 1, #taken do
  redis.call('ZADD', KEYS[1], ARGV[2], taken[i])
  local made = redis.call('HGET', KEYS[2], string.match(taken[i], '^[^ ]+ [^ ]+'))
  answer[#answer + 1] = taken[i]
  answer[#answer + 1] = made or '0'
end
return answer
