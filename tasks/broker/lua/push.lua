-- KEYS: the list, depths per lane, depths per list.
-- ARGV: the message, '1' to push it where it is taken next (the front), its lane clock
-- (0: not indexed), the due indexes' prefix, the wake prefix (keys.wake_key).
-- A message pushed, counted, indexed and announced in one step (lua/queue.lua).
-- include: queue
redis.call(ARGV[2] == '1' and 'RPUSH' or 'LPUSH', KEYS[1], ARGV[1])
pushed({KEYS[2], KEYS[3], ARGV[4], ARGV[5]}, KEYS[1], ARGV[1], ARGV[3])
return 1
