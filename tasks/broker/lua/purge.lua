-- KEYS: ledger, depths per lane, depths per list, then the lists of one queue.
-- ARGV: due prefix.
-- Empty a queue's lists; their messages leave the ledger, its depths and due index in
-- the same step. Returns how many messages were purged.
-- include: ledger
local book, purged = {KEYS[1], KEYS[2], KEYS[3], ARGV[1]}, 0
for i = 4, #KEYS do
  for _, raw in ipairs(redis.call('LRANGE', KEYS[i], 0, -1)) do
    local ok, message = pcall(cjson.decode, raw)
    local tag = ok and type(message) == 'table' and type(message.properties) == 'table'
      and message.properties.delivery_tag
    if type(tag) == 'string' then ledger_drop(book, tag) end
    purged = purged + 1
  end
  redis.call('DEL', KEYS[i])
end
return purged
