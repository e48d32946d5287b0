-- set_cron_next: pause a cron job (no next tick) or resume it from a given tick.
-- KEYS[1] cron       HASH  job name -> definition
-- KEYS[2] cron_next  ZSET  job name -> next tick (ms)
-- KEYS[3] cron_held  HASH  job name -> held tick
-- KEYS[4] wake       LIST
-- ARGV[1] job name
-- ARGV[2] next tick (ms), or -1 to pause
-- Returns: 1 done, 2 done and it was so already (paused before a pause: no next tick and
-- none held; live before a resume), 0 no such job.
-- @include wake
local name = ARGV[1]
if redis.call('HEXISTS', KEYS[1], name) == 0 then
  return 0
end
-- What is written below is read here first: a key of the wrong type fails the call
-- with nothing written (a script that fails half way keeps the writes it made).
redis.call('ZSCORE', KEYS[2], '')
redis.call('LLEN', KEYS[4])
local live = redis.call('ZSCORE', KEYS[2], name) ~= false
  or redis.call('HEXISTS', KEYS[3], name) == 1
local already = (tonumber(ARGV[2]) < 0) ~= live
redis.call('HDEL', KEYS[3], name)
if tonumber(ARGV[2]) < 0 then
  redis.call('ZREM', KEYS[2], name)
else
  redis.call('ZADD', KEYS[2], ARGV[2], name)
  wake_if(KEYS[4], true) -- a resumed job may be due before what the dispatcher waits for
end
return already and 2 or 1
