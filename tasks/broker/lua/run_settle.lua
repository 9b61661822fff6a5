-- KEYS: the run, the LRU set. ARGV: leader id, result JSON ('' = no admission), ttl s,
-- max entries, now, seconds a settled run is kept, the settle's token (lua/settle).
-- include: settle
return settle(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7])
