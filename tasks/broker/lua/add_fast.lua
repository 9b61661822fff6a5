-- ``add(balances, exhausted, account, delta, starting balance)`` -> what is left;
-- an account at zero or below joins the exhausted set, one above leaves it.
local function add(balances, exhausted, account, delta, start)
  local left = redis.call('HGET', balances, account)
  if not left then left = start end
  left = tonumber(left) + tonumber(delta)
  redis.call('HSET', balances, account, tostring(left))
  if left <= 0 then redis.call('SADD', exhausted, account)
  else redis.call('SREM', exhausted, account) end
  return tostring(left)
end
