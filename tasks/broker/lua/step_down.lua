-- KEYS: beat's leader. ARGV: this beat's identity.
-- Give the lead up at once (a beat shutting down), if it is still one's own.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
