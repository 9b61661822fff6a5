-- The queue protocol's bookkeeping (tasks.broker.handover), changed in the same step as
-- a list: the depth of each list and of its lane, the lane's due index (members
-- "<list>\n<message>", scored by when the job entered its lane: what beat's movers
-- read), and a wake-up on the list's queue for the workers that consume it.
-- ``book``: {depths per lane, depths per list, the due indexes' prefix, the wake prefix}.
-- A list's queue is its name up to kombu's priority separator; its lane, up to the
-- first '.' too. The depths per lane also count each level of the lane, as
-- "<lane>@<priority step>" (what a job entering at a level has ahead of it there:
-- lua/limits.lua). A count that reaches 0 leaves its hash.
local function queue_of(key) return string.match(key, '^[^\6]+') end
local function lane_of(key) return string.match(key, '^[^%.\6]+') end
local function step_of(key) return string.match(key, '\6\22([0-9]+)$') or '0' end
local function count_field(hash, field, by)
  if redis.call('HINCRBY', hash, field, by) <= 0 then redis.call('HDEL', hash, field) end
end
local function count_list(book, key, by)
  local lane = lane_of(key)
  count_field(book[1], lane, by)
  count_field(book[1], lane .. '@' .. step_of(key), by)
  count_field(book[2], key, by)
end
-- ``message`` was pushed to list ``key`` (``entered``: its lane clock, 0: not indexed).
local function pushed(book, key, message, entered)
  count_list(book, key, 1)
  if tonumber(entered) > 0 then
    redis.call('ZADD', book[3] .. lane_of(key), entered, key .. '\n' .. message)
  end
  redis.call('PUBLISH', book[4] .. queue_of(key), '')
end
-- ``message`` left list ``key`` (``indexed``: the list's messages are in the due index).
local function popped(book, key, message, indexed)
  count_list(book, key, -1)
  if indexed then redis.call('ZREM', book[3] .. lane_of(key), key .. '\n' .. message) end
end
