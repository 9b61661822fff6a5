-- The first depth limit a publish finds reached (routing.policy.DepthLimit), or nil.
-- ``spec``: limits separated by ';', each "why bound lane weight [lane weight ...]":
-- reached when the lanes' live depths (hash ``depths``) times their weights sum to
-- the bound or more. The policy computes every number; this only adds them up.
local function limit_reached(depths, spec)
  for limit in string.gmatch(spec or '', '[^;]+') do
    local words = {}
    for word in string.gmatch(limit, '%S+') do words[#words + 1] = word end
    local sum = 0
    for i = 3, #words, 2 do
      sum = sum + tonumber(redis.call('HGET', depths, words[i]) or '0') * tonumber(words[i + 1])
    end
    if sum >= tonumber(words[2]) then return words[1] end
  end
  return nil
end
