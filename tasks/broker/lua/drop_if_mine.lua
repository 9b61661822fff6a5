-- KEYS: holders, kombu's unacked hash and index. ARGV: delivery tag, this process.
-- An ack: the message's records go, unless another process holds that tag now.
-- include: ack
return ack(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2]) and 1 or 0
