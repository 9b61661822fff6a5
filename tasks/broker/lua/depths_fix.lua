-- KEYS: depths per lane, depths per list, beat's epoch. ARGV: beat's epoch, then pairs
-- of (field of the lane hash or '~' .. field of the list hash, correction).
-- The audit's corrections of the depth counters (``beat.ledger``): a delta computed
-- from one consistent read, so the pushes and takes since are kept; a count at or
-- below 0 leaves its hash.
-- include: fence
if not beat_leads(KEYS[3], ARGV[1]) then return 0 end
for i = 2, #ARGV, 2 do
  local hash, field = KEYS[1], ARGV[i]
  if string.sub(field, 1, 1) == '~' then hash, field = KEYS[2], string.sub(field, 2) end
  if redis.call('HINCRBY', hash, field, ARGV[i + 1]) <= 0 then redis.call('HDEL', hash, field) end
end
return (#ARGV - 1) / 2
