-- KEYS: a job's result key (Celery's result backend), its prediction's record.
-- ARGV: the entry (as the backend encodes it), how long it is kept (s, 0: for good),
-- the event its prediction's log gets (lua/events.lua: started or completed), its data.
-- Celery's own store of a state (lua/entry.lua), with the event in the same step.
-- include: events
-- include: entry
store_entry(KEYS[1], ARGV[1], ARGV[2])
add_event(KEYS[2], ARGV[3], ARGV[4])
return 1
