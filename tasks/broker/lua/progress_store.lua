-- KEYS: a job's result key (Celery's result backend), its prediction's record.
-- ARGV: its PROGRESS entry (JSON, as the backend encodes it), how long it is kept (s),
-- the progress itself (JSON: step, steps, eta_s, lane...).
-- Writes the progress unless a final state (lua/entry.lua) is stored: a
-- report of a run that was taken over, or that lost a race with its own end, never
-- hides a job's outcome. The prediction's event log gets it too (lua/events.lua).
-- Returns 1 when written.
-- include: events
-- include: entry
if holds_final(KEYS[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
add_event(KEYS[2], 'progress', ARGV[3])
return 1
