-- KEYS: worker stats, when each worker pushed them, when each worker's stats changed,
-- each worker's push before that change, who wrote beat's worker record last.
-- ARGV: read the stats changed since (Redis' clock), the freshness window (s), the last
-- round's cutoff, seconds after which a silent worker's stats are dropped, then the
-- workers beat counts silent.
-- Beat's read of one round, costing what changed, not the number of workers: Redis'
-- time; who wrote the record; (worker, changed at, its push before, stats) of each
-- worker whose stats changed since, or that was silent and pushed within the window;
-- the workers whose last push fell out of the window since the last round (by score).
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local cutoff = now - tonumber(ARGV[2])
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now - tonumber(ARGV[4])))
for _, host in ipairs(gone) do
  redis.call('HDEL', KEYS[1], host)
  redis.call('HDEL', KEYS[4], host)
  redis.call('ZREM', KEYS[2], host)
  redis.call('ZREM', KEYS[3], host)
end
local heard = redis.call('ZRANGEBYSCORE', KEYS[3], ARGV[1], '+inf')
for i = 5, #ARGV do
  local at = redis.call('ZSCORE', KEYS[2], ARGV[i])
  if at and tonumber(at) >= cutoff then heard[#heard + 1] = ARGV[i] end
end
local records = {}
for _, host in ipairs(heard) do
  local stats = redis.call('HGET', KEYS[1], host)
  if stats then
    records[#records + 1] = host
    records[#records + 1] = redis.call('ZSCORE', KEYS[3], host) or '0'
    records[#records + 1] = redis.call('HGET', KEYS[4], host) or '0'
    records[#records + 1] = stats
  end
end
local silent = redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[3], '(' .. cutoff)
return {string.format('%.6f', now), redis.call('GET', KEYS[5]) or '', records, silent,
        string.format('%.6f', cutoff)}
