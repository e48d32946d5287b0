-- start_backfill: record a cron job's backfill, due at once. The same range again leaves
-- its progress alone (a re-run does not run its ticks twice) and takes the new pace; a
-- new range replaces the backfill before it.
-- KEYS[1] cron               HASH  job name -> definition
-- KEYS[2] cron_backfill      HASH  job name -> "<from>|<to>|<spacing>|<next tick>|<fired>|<total>"
-- KEYS[3] cron_backfill_due  ZSET  job name -> when its backfill fires its next tick (ms)
-- KEYS[4] wake               LIST
-- ARGV[1] job name
-- ARGV[2] the range, "<from>|<to>" (ms)
-- ARGV[3] spacing (ms between two ticks' firings)
-- ARGV[4] the range's first tick (ms); ARGV[5] how many ticks it holds
-- ARGV[6] now (ms): when the first tick fires
-- Returns: {0 no such job | 1 started | 2 the same range, already recorded, its record}
-- @include wake
local name = ARGV[1]
if redis.call('HEXISTS', KEYS[1], name) == 0 then
  return {0, ''}
end
-- What is written below is read here first: a key of the wrong type fails the call
-- with nothing written (a script that fails half way keeps the writes it made).
local current = redis.call('HGET', KEYS[2], name)
redis.call('ZSCORE', KEYS[3], '')
redis.call('LLEN', KEYS[4])
if current and string.sub(current, 1, #ARGV[2] + 1) == ARGV[2] .. '|' then
  local rest = string.match(current, '^%d+|%d+|%d+|(.*)$')
  local record = ARGV[2] .. '|' .. ARGV[3] .. '|' .. rest
  redis.call('HSET', KEYS[2], name, record)
  return {2, record}
end
local record = ARGV[2] .. '|' .. ARGV[3] .. '|' .. ARGV[4] .. '|0|' .. ARGV[5]
redis.call('HSET', KEYS[2], name, record)
redis.call('ZADD', KEYS[3], ARGV[6], name)
wake_if(KEYS[4], true)
return {1, record}
