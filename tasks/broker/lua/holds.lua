-- whether the run ``token`` (run number ``n``) still holds its job: the lease
-- is its own, or lapsed with no newer run begun (``gpu_worker.lease``).
local function holds(lease_key, counter_key, token, n)
  local lease = redis.call('GET', lease_key)
  if lease then return lease == token end
  return tonumber(redis.call('GET', counter_key) or '0') == tonumber(n)
end
