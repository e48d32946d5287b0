-- set_cron_next: pause a cron job (no next tick) or resume it from a given tick.
-- KEYS[1] cron       HASH  job name -> definition
-- KEYS[2] cron_next  ZSET  job name -> when its next tick is due (ms)
-- KEYS[3] cron_held  HASH  job name -> held tick
-- KEYS[4] wake       LIST
-- KEYS[5] cron_state HASH  job name -> "<runs>|<failures in a row>|<ended>|<run to judge>"
-- KEYS[6] cron_last  HASH  job name -> task id of its latest fired tick
-- KEYS[7] cron_fired HASH  job name -> the spans of ticks its schedule enqueued
--         (fired_spans.lua): a pause or a resume closes its open span
-- ARGV[1] job name
-- ARGV[2] next due time (ms), or -1 to pause
-- Returns: 1 done, 2 done and it was so already (paused before a pause: no next tick and
-- none held; live before a resume), 0 no such job. A resume forgets the job's failed
-- runs (pause_after_failures counts again from 0) and that it ended; its runs so far
-- stay counted.
-- @include probes
-- @include wake
-- @include fired_spans
local name = ARGV[1]
if redis.call('HEXISTS', KEYS[1], name) == 0 then
  return 0
end
-- What is written below is read here first (probes.lua).
probe_zsets(KEYS[2])
probe_lists(KEYS[4])
probe_hashes(KEYS[6], KEYS[7])
local state = redis.call('HGET', KEYS[5], name)
local live = redis.call('ZSCORE', KEYS[2], name) ~= false
  or redis.call('HEXISTS', KEYS[3], name) == 1
local already = (tonumber(ARGV[2]) < 0) ~= live
redis.call('HDEL', KEYS[3], name)
close_fired(KEYS[7], KEYS[6], name)
if tonumber(ARGV[2]) < 0 then
  redis.call('ZREM', KEYS[2], name)
else
  redis.call('ZADD', KEYS[2], ARGV[2], name)
  if state then
    redis.call('HSET', KEYS[5], name, (string.match(state, '^(%d+)|') or '0') .. '|0|0|')
  end
  wake_if(KEYS[4], true) -- a resumed job may be due before what the dispatcher waits for
end
return already and 2 or 1
