-- KEYS: the run's pointer, the run. ARGV: the leader's id. Drops a claim not published.
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
if redis.call('HGET', KEYS[2], 'confirmed') ~= '1' then redis.call('DEL', KEYS[2]) end
