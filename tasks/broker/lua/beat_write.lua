-- KEYS: beat's epoch, the snapshot, the worker record, the members doc of the snapshot's
-- version, who wrote the worker record.
-- ARGV: beat's epoch, the snapshot, the members doc ('' : unchanged since this beat last
-- wrote it: only its time to live is renewed), its seconds to live, '1' to replace the
-- worker record whole (else only the workers named change), the writer's mark, then
-- pairs of (worker, its record; '' : dropped).
-- One heartbeat's writes, fenced: the worker record (whole, or what changed), the
-- members doc a router fetches by the version the snapshot names, then the snapshot.
-- Returns 0, having written nothing, when another beat leads, and -1 when the members
-- doc it was to renew is gone (the caller writes it whole).
-- include: fence
if not beat_leads(KEYS[1], ARGV[1]) then return 0 end
if ARGV[3] ~= '' then
  redis.call('SET', KEYS[4], ARGV[3], 'EX', ARGV[4])
elseif redis.call('EXPIRE', KEYS[4], ARGV[4]) == 0 then
  return -1
end
if ARGV[5] == '1' then redis.call('DEL', KEYS[3]) end
for i = 7, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[3], ARGV[i])
  else
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  end
end
redis.call('SET', KEYS[5], ARGV[6])
redis.call('SET', KEYS[2], ARGV[2])
return 1
