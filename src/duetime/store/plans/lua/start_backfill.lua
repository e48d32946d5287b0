-- start_backfill: record a cron job's backfill, due at once, if the job's backfill record
-- is still the one the caller read: the caller worked out from it which ticks of the range
-- earlier backfills handled (they are not run again), and a record that changed meanwhile
-- (a dispatcher fired a tick of it, another call replaced it) would make that wrong, so
-- nothing is written and the caller reads it again.
-- KEYS[1] cron               HASH  job name -> definition
-- KEYS[2] cron_backfill      HASH  job name -> "<from>|<to>|<spacing>|<next tick>|<fired>|
--                                  <total>|<skipped>|<ran before>|<covered spans>"
-- KEYS[3] cron_backfill_due  ZSET  job name -> when its backfill fires its next tick (ms)
-- KEYS[4] wake               LIST
-- ARGV[1] job name
-- ARGV[2] the record the caller read ('' when there was none)
-- ARGV[3] the new record
-- ARGV[4] now (ms): when its first tick fires
-- ARGV[5] 1 when it has a tick to run, 0 when every tick of its range had run already
-- Returns: 0 no such job | 1 recorded | 2 the record changed since it was read
-- @include probes
-- @include wake
local name = ARGV[1]
if redis.call('HEXISTS', KEYS[1], name) == 0 then
  return 0
end
-- What is written below is read here first (probes.lua).
local current = redis.call('HGET', KEYS[2], name) or ''
probe_zsets(KEYS[3])
probe_lists(KEYS[4])
if current ~= ARGV[2] then
  return 2
end
redis.call('HSET', KEYS[2], name, ARGV[3])
if ARGV[5] == '1' then
  redis.call('ZADD', KEYS[3], ARGV[4], name)
  wake_if(KEYS[4], true)
else
  redis.call('ZREM', KEYS[3], name)
end
return 1
