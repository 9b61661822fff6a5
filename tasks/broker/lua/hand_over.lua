-- KEYS: the holder's records (hash: take token -> "<list>\n<message>"), depths per lane,
-- depths per list, then the lists to take from, the one served first first.
-- ARGV: the take's token, '1' when it repeats a take whose answer was lost, '1' to
-- record the holder (a consumer that acks), the due indexes' prefix.
-- The hand-over: the next message of the first list that holds one leaves it and is
-- recorded under the token as held, in one step, so a message is always in a list or
-- in its holder's records. A take repeated with its token gets the message the lost
-- answer held, if it is still held. Returns {list, message}, or false when all are empty.
-- include: queue
local book = {KEYS[2], KEYS[3], ARGV[4], ''}
if ARGV[2] == '1' then
  local again = redis.call('HGET', KEYS[1], ARGV[1])
  if again then
    local at = string.find(again, '\n', 1, true)
    return {string.sub(again, 1, at - 1), string.sub(again, at + 1)}
  end
end
local lists = {}
for i = 4, #KEYS do lists[#lists + 1] = KEYS[i] end
local counts = redis.call('HMGET', KEYS[3], unpack(lists))
for i, key in ipairs(lists) do
  if counts[i] then
    local message = redis.call('RPOP', key)
    if message then
      if ARGV[3] == '1' then redis.call('HSET', KEYS[1], ARGV[1], key .. '\n' .. message) end
      popped(book, key, message)
      return {key, message}
    end
  end
end
return false
