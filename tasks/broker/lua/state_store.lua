-- KEYS: a job's result key (Celery's result backend).
-- ARGV: the entry of a state that is not final (RETRY: as the backend encodes it), how
-- long it is kept (s, 0: for good).
-- Celery's own store of a state, unless a final state is stored (lua/entry.lua). Celery
-- reads for SUCCESS before it writes, in a step of its own: a run that put its job's
-- next copy back in a lane before its RETRY was stored would hide the end of that copy,
-- run meanwhile by another worker, and its caller would wait for good. Returns 1 when
-- written.
-- include: entry
if holds_final(KEYS[1]) then return 0 end
store_entry(KEYS[1], ARGV[1], ARGV[2])
return 1
