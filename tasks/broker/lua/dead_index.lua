-- KEYS: dead letters, dead-letter index. ARGV: job id, when it failed (unix s), job id, ...
-- Indexes letters the index lacks (written before it existed) that are still there; a
-- letter requeued or replaced meanwhile is left as its own write left it.
local added = 0
for i = 1, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    added = added + redis.call('ZADD', KEYS[2], 'NX', ARGV[i + 1], ARGV[i])
  end
end
return added
