-- reschedule_task: give a waiting task a new run-at and envelope (compare-and-set).
-- KEYS[1] tasks      HASH
-- KEYS[2] scheduled  ZSET
-- KEYS[3] ready      LIST
-- KEYS[4] dead       ZSET
-- KEYS[5] wake       LIST
-- KEYS[6] early      HASH  task id -> run-at, for ids promoted ahead of it
-- ARGV[1] now (ms)
-- ARGV[2] task id
-- ARGV[3] new run-at (ms)
-- ARGV[4] the envelope the caller read
-- ARGV[5] the new envelope
-- Returns: 'ok'; 'changed' when the envelope changed since it was read (read again and
-- retry); 'running' or 'dead' when the task is not waiting; false when there is no such task.
local now, id, run_at = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local current = redis.call('HGET', KEYS[1], id)
if not current then
  return false
end
if current ~= ARGV[4] then
  return 'changed'
end
if redis.call('ZREM', KEYS[2], id) == 0 then
  if redis.call('ZSCORE', KEYS[4], id) then
    return 'dead'
  end
  if redis.call('LREM', KEYS[3], 1, id) == 0 then
    return 'running'
  end
  redis.call('HDEL', KEYS[6], id)
end
redis.call('HSET', KEYS[1], id, ARGV[5])
if run_at <= now then
  redis.call('RPUSH', KEYS[3], id)
else
  local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  redis.call('ZADD', KEYS[2], run_at, id)
  if (not head[2] or run_at < tonumber(head[2])) and redis.call('LLEN', KEYS[5]) == 0 then
    redis.call('RPUSH', KEYS[5], 1)
  end
end
return 'ok'
