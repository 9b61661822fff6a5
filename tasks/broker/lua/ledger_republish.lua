-- KEYS: ledger, unacked, the lane's lists, depths per lane, depths per list, beat's epoch.
-- ARGV: old tag, old entry, new tag, new entry's message, due prefix, beat's epoch.
-- Put a lost message back at the front of its list under a new delivery tag, so
-- that the lost copy, should its worker wake up after all, and the new one are
-- never confused in kombu's unacked records. Its depth was never taken off (a take
-- in flight counts): the new entry replaces the old at the same place in the due index.
-- include: ledger
-- include: fence
if not beat_leads(KEYS[6], ARGV[6]) then return 0 end
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
local cut = string.find(ARGV[2], '\n', 1, true)
local key = string.sub(ARGV[2], 1, cut - 1)
if redis.call('LPOS', key, string.sub(ARGV[2], cut + 1)) then return 0 end
local book = {KEYS[1], KEYS[4], KEYS[5], ARGV[5]}
local clock = redis.call('ZSCORE', ARGV[5] .. lane_of(key), ARGV[1]) or '0'
ledger_drop(book, ARGV[1])
ledger_add(book, ARGV[3], key, ARGV[4], clock)
redis.call('RPUSH', key, ARGV[4])
redis.call('SADD', KEYS[3], key)
return 1
