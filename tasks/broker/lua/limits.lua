-- The first limit a publish finds reached, or nil. ``spec``: limits separated by ';',
-- each "why bound key field weight [key field weight ...]": reached when the counters
-- named (field ``field`` of hash KEYS[key]) times their weights sum to the bound or
-- more. A lane's depth limit counts fields of the depths per lane
-- (routing.policy.DepthLimit); a limit on any other counter kept in a hash (an
-- account's running jobs) is one more term over one more key. The policy computes
-- every number; this only adds them up.
local function limit_reached(keys, spec)
  for limit in string.gmatch(spec or '', '[^;]+') do
    local words = {}
    for word in string.gmatch(limit, '%S+') do words[#words + 1] = word end
    local sum = 0
    for i = 3, #words, 3 do
      local count = redis.call('HGET', keys[tonumber(words[i])], words[i + 1]) or '0'
      sum = sum + tonumber(count) * tonumber(words[i + 2])
    end
    if sum >= tonumber(words[2]) then return words[1] end
  end
  return nil
end
