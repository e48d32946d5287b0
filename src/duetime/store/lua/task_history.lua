-- task_history: one task's entries in the history, newest first, read in one atomic step.
-- KEYS[1] history state HASH  (history.lua): "seq", the number of the newest entry
-- KEYS[2] history       LIST  (history.lua): entry number n at index (seq - n)
-- KEYS[3] history tasks ZSET  (history.lua): task id -> the number of its newest entry
-- ARGV[1] task id
-- ARGV[2] how many entries, at most
-- Returns: {the number of its newest entry, {its entries still kept, newest first}}
-- (each entry names the one before it of the same task). The walk stops at an entry
-- that is gone or not the task's.
local id = ARGV[1]
local last = tonumber(redis.call('HGET', KEYS[1], 'seq') or 0)
local number = tonumber(redis.call('ZSCORE', KEYS[3], id))
local newest = number or 0
local found = {}
while last and number and last >= number and #found < tonumber(ARGV[2]) do
  local blob = redis.call('LINDEX', KEYS[2], last - number)
  if not blob then
    break
  end
  local read, entry = pcall(cmsgpack.unpack, blob)
  if not read or type(entry) ~= 'table' or entry[1] ~= id then
    break
  end
  found[#found + 1] = blob
  local before = entry[9] and tonumber(entry[9])
  if not before or before >= number then
    break
  end
  number = before
end
return {newest, found}
