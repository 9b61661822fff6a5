-- KEYS: the holder's records (hash: take token -> "<list>\n<message>"), depths per lane,
-- depths per list, the set of holders, then the lists to take from, the one served
-- first first.
-- ARGV: the take's token, '1' to record the holder (a consumer that acks), the due
-- indexes' prefix, then per list '1' if its messages are in the due index, else '0',
-- the holder's name.
-- The hand-over: the next message of the first list that holds one leaves it and is
-- recorded under the token as held, in one step, so a message is always in a list or
-- in its holder's records. A take repeated with its token (its answer was lost, or
-- redis-py sent it again on a new connection) answers the message it took then, if it
-- is still held. Returns {list, message, 1 if the lists may hold more, else 0}, or false
-- when all are empty. The depth counters say which lists to look at; an item pushed
-- without them (a hand-typed LPUSH) is found once the counted lists are empty.
-- include: queue
local book = {KEYS[2], KEYS[3], ARGV[3], ''}
local again = redis.call('HGET', KEYS[1], ARGV[1])
if again then
  local at = string.find(again, '\n', 1, true)
  return {string.sub(again, 1, at - 1), string.sub(again, at + 1), 1}
end
local lists = {}
for i = 5, #KEYS do lists[#lists + 1] = KEYS[i] end
local counts = redis.call('HMGET', KEYS[3], unpack(lists))
local function take(i)
  local key = lists[i]
  local message = redis.call('RPOP', key)
  if not message then return nil end
  if ARGV[2] == '1' then
    redis.call('HSET', KEYS[1], ARGV[1], key .. '\n' .. message)
    redis.call('SADD', KEYS[4], ARGV[5])
  end
  popped(book, key, message, string.sub(ARGV[4], i, i) == '1')
  local more = (tonumber(counts[i]) or 0) > 1 and 1 or 0
  for j = i + 1, #lists do
    if counts[j] then more = 1 end
  end
  return {key, message, more}
end
local counted = 0
for i = 1, #lists do
  if counts[i] then
    counted = counted + 1
    local got = take(i)
    if got then return got end
  end
end
if redis.call('EXISTS', unpack(lists)) > counted then  -- an item pushed uncounted
  for i = 1, #lists do
    if not counts[i] then
      local got = take(i)
      if got then return got end
    end
  end
end
return false
