-- KEYS: ledger, depths per lane, depths per list, the lane's lists.
-- ARGV: delivery tag, list key, message, lane clock (0: not indexed), due prefix.
-- The ledger entry (and its bookkeeping) of a message pushed beside this call, in the
-- same transaction: kombu's restores of an unacked message (``tasks.broker.transport``).
-- include: ledger
local book = {KEYS[1], KEYS[2], KEYS[3], ARGV[5]}
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
ledger_add(book, ARGV[1], ARGV[2], ARGV[3], ARGV[4])
redis.call('SADD', KEYS[4], ARGV[2])
return 1
