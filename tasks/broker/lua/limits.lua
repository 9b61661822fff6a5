-- The first limit a publish finds reached, or nil. ``spec``: limits separated by ';',
-- each "why bound key field weight [key field weight ...]": reached when the counters
-- named (field ``field`` of hash KEYS[key]) times their weights sum to the bound or
-- more. A lane's depth limit counts fields of the depths per lane
-- (routing.policy.DepthLimit); a limit on any other counter kept in a hash (an
-- account's running jobs) is one more term over one more key. The policy computes
-- every number; this only adds them up. ``ahead``: for a job entering its lane at a
-- level (lua/fair.lua), {lane, the depth fields of its level and those before it}: an
-- admission ('over_budget') counts of its own lane only those (routing.fair.
-- depths_ahead); the lane's maximum depth ('full') counts all of it, against the share of
-- the bound its level may fill, the third of ``ahead`` (routing.fair.at_level).
local function limit_reached(keys, spec, ahead)
  for limit in string.gmatch(spec or '', '[^;]+') do
    local words = {}
    for word in string.gmatch(limit, '%S+') do words[#words + 1] = word end
    local sum = 0
    for i = 3, #words, 3 do
      local fields = {words[i + 1]}
      if ahead and words[1] == 'over_budget' and words[i + 1] == ahead[1] then
        fields = ahead[2]
      end
      for _, field in ipairs(fields) do
        local count = redis.call('HGET', keys[tonumber(words[i])], field) or '0'
        sum = sum + tonumber(count) * tonumber(words[i + 2])
      end
    end
    local bound = tonumber(words[2])
    if ahead and words[1] == 'full' then bound = bound * ahead[3] end
    if sum >= bound then return words[1] end
  end
  return nil
end
