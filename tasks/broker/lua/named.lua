-- ARGV from ``first`` on, read as name/value pairs into a table (a name absent: nil);
-- written by tasks.broker.publish.named.
local function named(argv, first)
  local a = {}
  for i = first, #argv, 2 do a[argv[i]] = argv[i + 1] end
  return a
end
