-- KEYS: the holder's records (hash: take token -> "<list>\n<message>"), depths per lane,
-- depths per list, the set of holders, then the lists to take from, the one served
-- first first.
-- ARGV: the take's token, '1' to record the holder (a consumer that acks), the due
-- indexes' prefix, then per list '1' if its messages are in the due index, else '0',
-- the holder's name, the taker's wake-up channel ('' : none, it waits for no wake-up),
-- the wake prefix, how long an idle record is kept (s).
-- The hand-over: the next message of the first list that holds one leaves it and is
-- recorded under the token as held, in one step, so a message is always in a list or
-- in its holder's records. A take repeated with its token (its answer was lost, or
-- redis-py sent it again on a new connection) answers the message it took then, if it
-- is still held. Returns {list, message, 1 if the lists may hold more, else 0}, or false
-- when all are empty. The depth counters say which lists to look at; an item pushed
-- without them (a hand-typed LPUSH) is found once the counted lists are empty.
-- A taker with a wake-up channel found idle (all empty) is recorded in each of its
-- queues' wake sets (keys.wake_key), where a push finds it, and leaves them with a job.
-- Its idle takes record it again: a record older than the keep is of a consumer gone,
-- dropped as another is made. A take that leaves messages behind wakes one more idle
-- consumer: one woken by pushes to two of its queues takes only one job.
-- include: queue
local book = {KEYS[2], KEYS[3], ARGV[3], ''}
local again = redis.call('HGET', KEYS[1], ARGV[1])
if again then
  local at = string.find(again, '\n', 1, true)
  return {string.sub(again, 1, at - 1), string.sub(again, at + 1), 1}
end
local lists = {}
local queues = {}  -- the lists' queues, a set
for i = 5, #KEYS do
  lists[#lists + 1] = KEYS[i]
  queues[queue_of(KEYS[i])] = true
end
local counts = redis.call('HMGET', KEYS[3], unpack(lists))
-- Wake an idle consumer for the messages left in the lists from the ``i``-th on (each
-- queue tried once: its levels share one wake set).
local function pass_on(i)
  local tried = {}
  for j = i, #lists do
    local queue = queue_of(lists[j])
    if (tonumber(counts[j]) or 0) > (j == i and 1 or 0) and not tried[queue] then
      if wake_one(ARGV[7], queue) == 1 then return end
      tried[queue] = true
    end
  end
end
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
  if ARGV[6] ~= '' then
    for queue in pairs(queues) do redis.call('ZREM', ARGV[7] .. queue, ARGV[6]) end
  end
  if more == 1 then pass_on(i) end
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
if ARGV[6] ~= '' then
  local t = redis.call('TIME')
  local now, kept = tonumber(t[1]) + tonumber(t[2]) / 1e6, tonumber(ARGV[8])
  for queue in pairs(queues) do
    local idle = ARGV[7] .. queue
    redis.call('ZADD', idle, now, ARGV[6])
    redis.call('ZREMRANGEBYSCORE', idle, '-inf', '(' .. (now - kept))
    redis.call('EXPIRE', idle, math.ceil(kept))
  end
end
return false
