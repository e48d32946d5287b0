-- history_page: a run of the history's entries, newest first, read in one atomic step.
-- KEYS[1] history state HASH  (history.lua): "seq", the number of the newest entry
-- KEYS[2] history       LIST  (history.lua): entry number n at index (seq - n)
-- ARGV[1] the first entry wanted is the newest numbered below this (0: the newest of all)
-- ARGV[2] how many entries, at most
-- Returns: {number of the first entry returned, {entries}}: the entries are numbered
-- from that one down, one apart. {0, {}} when the history holds nothing (or its number
-- is not one: the invariant checker reports it).
local last = tonumber(redis.call('HGET', KEYS[1], 'seq') or 0)
if not last then
  return {0, {}}
end
local below = tonumber(ARGV[1])
local start = 0
if below > 0 then
  start = math.max(0, last - below + 1)
end
return {last - start, redis.call('LRANGE', KEYS[2], start, start + tonumber(ARGV[2]) - 1)}
