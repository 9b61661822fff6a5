-- KEYS: depths per lane, depths per list, then the lists to empty.
-- ARGV: the due indexes' prefix.
-- Every message of the lists dropped, with its count and index entry. Returns how many.
-- include: queue
local book, dropped = {KEYS[1], KEYS[2], ARGV[1], ''}, 0
for i = 3, #KEYS do
  for _, message in ipairs(redis.call('LRANGE', KEYS[i], 0, -1)) do
    popped(book, KEYS[i], message, true)
    dropped = dropped + 1
  end
  redis.call('DEL', KEYS[i])
end
return dropped
