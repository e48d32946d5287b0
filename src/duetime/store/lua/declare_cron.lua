-- declare_cron: create or update a cron job definition; unchanged definitions are left alone.
-- KEYS[1] cron       HASH  job name -> definition
-- KEYS[2] cron_next  ZSET  job name -> next tick (ms); a paused job is absent
-- KEYS[3] wake       LIST
-- ARGV[1] job name
-- ARGV[2] definition
-- ARGV[3] first tick after now (ms), used when the job is new or changed
-- Returns: 0 unchanged, 1 created, 2 updated (a paused job stays paused).
-- @include wake
local name = ARGV[1]
local current = redis.call('HGET', KEYS[1], name)
if current == ARGV[2] then
  return 0
end
-- What is written below is read here first: a key of the wrong type fails the call
-- with nothing written (a script that fails half way keeps the writes it made).
redis.call('ZSCORE', KEYS[2], '')
redis.call('LLEN', KEYS[3])
redis.call('HSET', KEYS[1], name, ARGV[2])
if current and not redis.call('ZSCORE', KEYS[2], name) then
  return 2
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
redis.call('ZADD', KEYS[2], ARGV[3], name)
wake_if(KEYS[3], comes_before(tonumber(ARGV[3]), head))
return current and 2 or 1
