-- sweep_keyed: drop the records of keys that mean nothing more (a dispatcher's
-- housekeeping), at most ARGV[2] per call. A debounce record means nothing once its
-- run-at has passed, a throttle record once its window (and the one its trailing run
-- opens) has ended: a later call starts afresh either way. A unique record is kept while
-- its task is live (as its until says), and looked at again ARGV[3] ms later.
-- KEYS[1] keyed          HASH  "<mode>:<key>" -> the key's record (keyed.lua)
-- KEYS[2] keyed_expiry   ZSET  "<mode>:<key>" -> when the record means nothing more (ms)
-- KEYS[3] keyed_tasks    HASH  task id -> the "<mode>:<key>" whose record names it
-- KEYS[4] tasks          HASH  task id -> envelope
-- KEYS[5] attempts       HASH  task id -> attempts started
-- KEYS[6] dead           ZSET  task id -> time of death
-- ARGV[1] now (ms, server clock)
-- ARGV[2] most records to look at
-- ARGV[3] how long (ms) until a live unique record is looked at again
-- ARGV[4] look at records due up to this time (ms, a little before now: a producer whose
--         clock reads a little behind this one may still find a record it can use)
-- Returns {records dropped, records kept, records looked at}.
-- @include probes
-- @include keyed_records
local now = tonumber(ARGV[1])
local fields = redis.call('ZRANGE', KEYS[2], '-inf', ARGV[4], 'BYSCORE', 'LIMIT', 0,
  tonumber(ARGV[2]))
-- Every key written below is read first (probes.lua).
probe_hashes(KEYS[1], KEYS[3])
local dropped, kept = 0, 0
for _, field in ipairs(fields) do
  local record = redis.call('HGET', KEYS[1], field)
  local parts = record and split_record(record) or {}
  local live = false
  if string.sub(field, 1, 2) == 'u:' and #parts == 3 and redis.call('HEXISTS', KEYS[4], parts[1]) == 1
      and not redis.call('ZSCORE', KEYS[6], parts[1]) then
    live = parts[2] == 'finished' or redis.call('HEXISTS', KEYS[5], parts[1]) == 0
  end
  if live then
    redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), field)
    kept = kept + 1
  else
    if record then
      redis.call('HDEL', KEYS[1], field)
      forget_keyed_task(KEYS[3], field, parts[1])
      if string.sub(field, 1, 2) == 't:' then
        forget_keyed_task(KEYS[3], field, parts[4])
      end
    end
    redis.call('ZREM', KEYS[2], field)
    dropped = dropped + 1
  end
end
return {dropped, kept, #fields}
