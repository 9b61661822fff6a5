-- KEYS: the list depths hash (list key -> messages waiting in it).
-- Every (list, depth) pair as one string, each list and each depth followed by a newline
-- (a list key holds none: the due index parts its entries at one): one bulk reply that
-- the reader splits at once, where a reply of two items a list costs a parse each.
local pairs = redis.call('HGETALL', KEYS[1])
if #pairs == 0 then return '' end
return table.concat(pairs, '\n') .. '\n'
