-- set_history: how many finished attempts the history keeps; trims it at once.
-- KEYS[1] history state HASH  (history.lua): "size", "seq"
-- KEYS[2] history       LIST  (history.lua)
-- KEYS[3] history tasks ZSET  (history.lua)
-- ARGV[1] the size: entries to keep, 0 to keep none (the history is deleted), or -1 for
--         the default (HISTORY_DEFAULT_SIZE)
-- Returns: the size now in force. A number of the newest entry that is not a number
-- (edited by hand) starts the history again, empty.
-- @include history
-- Every key written below is read first: a key of the wrong type fails the call with
-- nothing written.
local last = tonumber(redis.call('HGET', KEYS[1], 'seq') or 0)
redis.call('LLEN', KEYS[2])
redis.call('ZCARD', KEYS[3])
local size = tonumber(ARGV[1])
if size < 0 then
  redis.call('HDEL', KEYS[1], 'size')
  size = HISTORY_DEFAULT_SIZE
else
  redis.call('HSET', KEYS[1], 'size', size)
end
if size == 0 or not last then
  redis.call('DEL', KEYS[2])
  redis.call('DEL', KEYS[3])
  if not last then
    redis.call('HDEL', KEYS[1], 'seq')
  end
else
  redis.call('LTRIM', KEYS[2], 0, size - 1)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', last - size)
end
return size
