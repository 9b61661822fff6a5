-- The queue protocol's bookkeeping (tasks.broker.handover), changed in the same step as
-- a list: the depth of each list and of its lane, the lane's due index (members
-- "<list>\n<message>", scored by when the job entered its lane: what beat's movers
-- read), and a wake-up for one idle consumer of the list's queue (``wake_one``).
-- ``book``: {depths per lane, depths per list, the due indexes' prefix, the wake prefix}.
-- A list's queue is its name up to kombu's priority separator; its lane, up to the
-- first '.' too. The depths per lane also count each level of the lane, as
-- "<lane>@<priority step>" (what a job entering at a level has ahead of it there:
-- lua/limits.lua). A count that reaches 0 leaves its hash.
local function queue_of(key) return string.match(key, '^[^\6]+') end
local function lane_of(key) return string.match(key, '^[^%.\6]+') end
local function step_of(key) return string.match(key, '\6\22([0-9]+)$') or '0' end
local function count_field(hash, field, by)
  local count = redis.call('HINCRBY', hash, field, by)
  if count <= 0 then redis.call('HDEL', hash, field) end
  return count
end
-- Past a few dozen lists, the depths per list are kept in a real hash table: Redis'
-- compact encoding finds a field by scanning them all (up to its limit, 128 or 512
-- fields), so every push and take would cost more with each worker's own queue. A
-- field too long for the compact encoding converts it, for as long as the hash lives;
-- checked as a list's field is made, the only time the hash grows.
local WIDE = string.rep('-', 1025)
local function keep_wide(hash)
  if redis.call('HLEN', hash) <= 64 then return end
  if redis.call('OBJECT', 'ENCODING', hash) ~= 'hashtable' then
    redis.call('HSET', hash, WIDE, '')
    redis.call('HDEL', hash, WIDE)
  end
end
local function count_list(book, key, by)
  local lane = lane_of(key)
  count_field(book[1], lane, by)
  count_field(book[1], lane .. '@' .. step_of(key), by)
  if count_field(book[2], key, by) == by and by > 0 then keep_wide(book[2]) end
end
-- Idle consumers tried per wake-up at most: one gone (its channel heard by none) is
-- dropped as it is met; the records of the rest age out (lua/hand_over.lua).
local WAKE_TRIES = 8
-- Wake one idle consumer of ``queue`` on its own channel, taking it off the queue's set
-- (keys.wake_key: ``prefix`` .. queue), the latest idle first (the surest to be alive):
-- one PUBLISH to one subscriber, whatever the number of consumers. 1 if one heard it.
local function wake_one(prefix, queue)
  for _ = 1, WAKE_TRIES do
    local idle = redis.call('ZPOPMAX', prefix .. queue)
    if not idle[1] then return 0 end
    if redis.call('PUBLISH', idle[1], '') > 0 then return 1 end
  end
  return 0
end
-- ``message`` was pushed to list ``key`` (``entered``: its lane clock, 0: not indexed).
local function pushed(book, key, message, entered)
  count_list(book, key, 1)
  if tonumber(entered) > 0 then
    redis.call('ZADD', book[3] .. lane_of(key), entered, key .. '\n' .. message)
  end
  wake_one(book[4], queue_of(key))
end
-- ``message`` left list ``key`` (``indexed``: the list's messages are in the due index).
local function popped(book, key, message, indexed)
  count_list(book, key, -1)
  if indexed then redis.call('ZREM', book[3] .. lane_of(key), key .. '\n' .. message) end
end
