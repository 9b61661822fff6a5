-- KEYS: cache entry, LRU set, in-flight pointer, the caller's run, the metrics hash.
-- ARGV: caller id, 'a' (admit) and/or 'd' (drop the entry), follower JSON, now, tier
-- rank, seconds an unpublished claim lives, the run keys' prefix (lua/claim.lua).
-- include: claim
return claim_run(KEYS, ARGV)
