-- KEYS: balance hash, exhausted set. ARGV: account, delta, starting balance.
-- include: add_fast
return add(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
