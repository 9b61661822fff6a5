-- KEYS: lease, run counter. ARGV: token, run number.
-- include: holds
if holds(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then redis.call('DEL', KEYS[1]) end
