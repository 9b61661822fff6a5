-- KEYS: per lane, the account's jobs waiting there, then the lane's accounts with jobs
-- waiting (pairs). ARGV: the account, the job.
-- A job that never started (revoked, past its Cancel-After) leaves them (lua/leave.lua).
-- include: leave
for i = 1, #KEYS, 2 do leave_fair(KEYS[i], KEYS[i + 1], ARGV[1], ARGV[2]) end
return 1
