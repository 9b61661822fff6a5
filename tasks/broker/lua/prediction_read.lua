-- KEYS: a prediction's record. ARGV: the due indexes' prefix.
-- A prediction just made, read in one step: its record's fields (flat), then how many
-- jobs of its lane entered before it (-1: not kept: parked, or not indexed).
local fields = redis.call('HGETALL', KEYS[1])
local position = -1
local record = {}
for i = 1, #fields, 2 do record[fields[i]] = fields[i + 1] end
local entered = tonumber(record.entered or '0')
if record.lane and entered > 0 and record.parked ~= '1' then
  position = redis.call('ZCOUNT', ARGV[1] .. record.lane, '-inf', '(' .. record.entered)
end
fields[#fields + 1] = position
return fields
