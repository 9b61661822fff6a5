-- ``ack(holders, unacked hash, unacked index, tag, holder)``: the message's records go,
-- unless another process holds that tag now (an AOF that lost its last second can hand
-- the same tag to another worker); whether they went.
local function ack(holders, unacked, index, tag, holder)
  local who = redis.call('HGET', holders, tag)
  if who and holder ~= '' and who ~= holder then return false end
  redis.call('HDEL', holders, tag)
  redis.call('HDEL', unacked, tag)
  redis.call('ZREM', index, tag)
  return true
end
