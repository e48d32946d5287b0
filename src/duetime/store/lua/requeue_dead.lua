-- requeue_dead: give dead tasks a fresh set of attempts, due now.
-- KEYS[1] dead       ZSET
-- KEYS[2] attempts   HASH
-- KEYS[3] errors     HASH
-- KEYS[4] ready      LIST
-- KEYS[5] stats      HASH
-- ARGV[1..] task ids
-- Returns: number requeued (ids not in dead are ignored).
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
  redis.call('HINCRBY', KEYS[5], 'requeued', count)
end
return count
