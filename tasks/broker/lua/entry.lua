-- A job's entry in Celery's result backend, at ``key``: included by the scripts that
-- store one.

-- Whether it holds the job's final state: SUCCESS, FAILURE or REVOKED.
local function holds_final(key)
  local now = redis.call('GET', key)
  if not now then return false end
  local ok, meta = pcall(cjson.decode, now)
  if not (ok and type(meta) == 'table') then return false end
  local status = meta['status']
  return status == 'SUCCESS' or status == 'FAILURE' or status == 'REVOKED'
end

-- Celery's own store of ``entry`` (a SETEX, a SET when kept for good, and a PUBLISH to
-- those who wait on it: the commands Celery sends); ``expires_s``: how long it is kept.
local function store_entry(key, entry, expires_s)
  if tonumber(expires_s) > 0 then
    redis.call('SETEX', key, expires_s, entry)
  else
    redis.call('SET', key, entry)
  end
  redis.call('PUBLISH', key, entry)
end
