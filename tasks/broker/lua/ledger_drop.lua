-- KEYS: ledger, depths per lane, depths per list, beat's epoch.
-- ARGV: due prefix, beat's epoch (required: only beat drops entries), then delivery tags.
-- Drop ledger entries whose messages are settled (taken, finished, unreadable) or
-- purged, with their depths and due index; returns how many were there.
-- include: ledger
-- include: fence
if not beat_leads(KEYS[4], ARGV[2]) then return 0 end
local book, dropped = {KEYS[1], KEYS[2], KEYS[3], ARGV[1]}, 0
for i = 3, #ARGV do
  if ledger_drop(book, ARGV[i]) then dropped = dropped + 1 end
end
return dropped
