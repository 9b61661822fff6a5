-- KEYS: kombu's unacked index and hash, holders, ledger, depths per lane, depths per list.
-- ARGV: delivery tag, now (unix s), the unacked record, the holding process ('' : none),
-- due prefix, the list the message came from ('': not known, the ledger says).
-- A worker records a message it popped as unacked (and who holds it), and its ledger
-- entry goes with its lane's depth (and due index, when the ledger names the list): one
-- step, so a message is always counted once, in a list (or a take in flight) or unacked.
-- include: ledger
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[3], ARGV[1], ARGV[4]) end
local book = {KEYS[4], KEYS[5], KEYS[6], ARGV[5]}
if ARGV[6] ~= '' then return ledger_taken(book, ARGV[1], ARGV[6]) and 1 or 0 end
return ledger_drop(book, ARGV[1]) and 1 or 0
