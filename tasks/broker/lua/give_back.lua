-- KEYS: the holder's records, depths per lane, depths per list, then ('' when unused)
-- beat's epoch, the job's lease, its result, the dead letters.
-- ARGV: the take's token, the record it must still be ('' : whichever), the lane clock
-- (0: not indexed), the due indexes' prefix, the wake prefix, beat's epoch ('' : not
-- beat), the holder (its lease: left while it still holds it, '' : never left), the job
-- id, the released lease's mark, how long it is kept.
-- A held message back at the front of its list (taken next), in the step that drops its
-- record: a worker giving back what it will not run, or beat a dead holder's. Returns
-- 1 (back), 0 (not held any more, or left: another beat leads, or its holder still runs
-- it), -1 (its job finished: the record only dropped). A job's lease that lapsed is
-- marked released in the same step: the run that let it lapse (frozen, cut off) cannot
-- take it again; the copy given back can.
-- include: queue
-- include: fence
if not leads(KEYS[4], ARGV[6]) then return 0 end
local record = redis.call('HGET', KEYS[1], ARGV[1])
if not record or (ARGV[2] ~= '' and record ~= ARGV[2]) then return 0 end
if ARGV[7] ~= '' and ARGV[8] ~= '' then
  local lease = redis.call('GET', KEYS[5])
  if lease and string.sub(lease, 1, #ARGV[7] + 1) == ARGV[7] .. '#' then return 0 end
end
redis.call('HDEL', KEYS[1], ARGV[1])
if ARGV[8] ~= '' and (redis.call('EXISTS', KEYS[6]) == 1
                      or redis.call('HEXISTS', KEYS[7], ARGV[8]) == 1) then
  return -1
end
local at = string.find(record, '\n', 1, true)
local key, message = string.sub(record, 1, at - 1), string.sub(record, at + 1)
if ARGV[8] ~= '' then redis.call('SET', KEYS[5], ARGV[9] .. 'put-back', 'NX', 'EX', ARGV[10]) end
redis.call('RPUSH', key, message)
pushed({KEYS[2], KEYS[3], ARGV[4], ARGV[5]}, key, message, ARGV[3])
return 1
