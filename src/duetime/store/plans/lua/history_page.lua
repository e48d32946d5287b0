-- history_page: a run of the history's entries, newest first, read in one atomic step.
-- KEYS[1] history state HASH  (history.lua): "size", "seq" (the newest entry's number)
-- KEYS[2] history       LIST  (history.lua): entry number n at index (seq - n)
-- ARGV[1] the first entry wanted is the newest numbered below this (0: the newest of all)
-- ARGV[2] how many entries, at most
-- Returns: {number of the first entry returned, {entries}}: the entries are numbered
-- from that one down, one apart; only the history's first "size" entries are read (the
-- log may hold up to HISTORY_TRIM_STEP more, not yet trimmed). {0, {}} when the history
-- holds nothing (or its size or number is not one: the invariant checker reports it).
-- @include history
local state = redis.call('HMGET', KEYS[1], 'size', 'seq')
local size = tonumber(state[1] or HISTORY_DEFAULT_SIZE)
local last = tonumber(state[2] or 0)
if not size or not last then
  return {0, {}}
end
local below = tonumber(ARGV[1])
local start = 0
if below > 0 then
  start = math.max(0, last - below + 1)
end
local stop = math.min(start + tonumber(ARGV[2]), size) - 1
if stop < start then
  return {last - start, {}}
end
return {last - start, redis.call('LRANGE', KEYS[2], start, stop)}
