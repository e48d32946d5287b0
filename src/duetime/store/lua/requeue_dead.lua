-- requeue_dead: give dead tasks a fresh set of attempts, due now.
-- KEYS[1] dead       ZSET
-- KEYS[2] attempts   HASH
-- KEYS[3] errors     HASH
-- KEYS[4] ready      LIST
-- KEYS[5] stats      HASH
-- ARGV[1..] task ids
-- Returns: number requeued (ids not in dead are ignored).
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- What is written below is read here first: a key of the wrong type fails the call
-- with nothing written (a script that fails half way keeps the writes it made).
if #ARGV > 0 then
  redis.call('HGET', KEYS[2], '')
  redis.call('HGET', KEYS[3], '')
  redis.call('LLEN', KEYS[4])
end
local count = 0
for _, id in ipairs(ARGV) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('RPUSH', KEYS[4], id)
    count = count + 1
  end
end
if count > 0 then
  redis.pcall('HINCRBY', KEYS[5], 'requeued', count)
end
return count
