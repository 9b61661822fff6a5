-- The ledger's bookkeeping, changed with the ledger in the same step: lane depths
-- (the messages of each lane and of each list the ledger holds: published, not yet
-- taken) and each lane's due index (delivery tag -> when the job entered its lane), from
-- which beat's movers find the jobs past their lane's budget or aging time.
-- ``book`` is the ledger's keys: {ledger, depths per lane, depths per list, the due
-- indexes' key prefix}. A list's lane is its name up to the first '.' or priority
-- separator; a count that reaches 0 leaves its hash (a worker gone leaves nothing).
local function lane_of(key) return string.match(key, '^[^%.\6]+') end
local function count(book, key, by)
  local lane = lane_of(key)
  if redis.call('HINCRBY', book[2], lane, by) <= 0 then redis.call('HDEL', book[2], lane) end
  if redis.call('HINCRBY', book[3], key, by) <= 0 then redis.call('HDEL', book[3], key) end
end
-- Write a message's entry (``entered``: its lane clock, 0: not indexed).
local function ledger_add(book, tag, key, message, entered)
  redis.call('HSET', book[1], tag, key .. '\n' .. message)
  count(book, key, 1)
  if tonumber(entered) > 0 then redis.call('ZADD', book[4] .. lane_of(key), entered, tag) end
end
-- Drop a message's entry; the list it was in, or false when it had none.
local function ledger_drop(book, tag)
  local entry = redis.call('HGET', book[1], tag)
  if not entry then return false end
  redis.call('HDEL', book[1], tag)
  local key = string.sub(entry, 1, string.find(entry, '\n', 1, true) - 1)
  count(book, key, -1)
  redis.call('ZREM', book[4] .. lane_of(key), tag)
  return key
end
-- A message taken from list ``key`` (the list BRPOP named) leaves the ledger and that
-- list's and lane's depths; its due index entry is left to beat's movers, which drop
-- the entries the ledger no longer has (``tasks.broker.moves``). False: no entry.
local function ledger_taken(book, tag, key)
  if redis.call('HDEL', book[1], tag) == 0 then return false end
  count(book, key, -1)
  return key
end
