-- task_history: one task's entries in the history, newest first, read in one atomic step.
-- KEYS[1] history state HASH  (history.lua): "size", "seq" (the newest entry's number)
-- KEYS[2] history       LIST  (history.lua): entry number n at index (seq - n)
-- KEYS[3] history tasks ZSET  (history.lua): task id -> the number of its newest entry
-- ARGV[1] task id
-- ARGV[2] how many entries, at most
-- Returns: {the number of its newest entry, {its entries still kept, newest first}}
-- (each entry names the one before it of the same task). The walk stops at an entry
-- that is gone (or past the history's size: not yet trimmed) or not the task's.
-- @include history
local id = ARGV[1]
local state = redis.call('HMGET', KEYS[1], 'size', 'seq')
local size = tonumber(state[1] or HISTORY_DEFAULT_SIZE) or 0
local last = tonumber(state[2] or 0)
local number = tonumber(redis.call('ZSCORE', KEYS[3], id))
local newest = number or 0
local found = {}
while last and number and last >= number and last - number < size
    and #found < tonumber(ARGV[2]) do
  local entry = redis.call('LINDEX', KEYS[2], last - number)
  local bar = entry and string.find(entry, '|', 1, true)
  if not bar then
    break
  end
  local read, record = pcall(cmsgpack.unpack, string.sub(entry, bar + 1))
  if not read or type(record) ~= 'table' or record[1] ~= id then
    break
  end
  found[#found + 1] = entry
  local before = tonumber(string.sub(entry, 1, bar - 1))
  if not before or before >= number then
    break
  end
  number = before
end
return {newest, found}
