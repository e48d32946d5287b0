-- remove_cron: forget a cron job (ticks already enqueued run as ordinary tasks).
-- KEYS[1] cron       HASH
-- KEYS[2] cron_next  ZSET
-- KEYS[3] cron_last  HASH
-- KEYS[4] cron_held  HASH
-- ARGV[1] job name
-- Returns: 1 removed, 0 no such job.
local name = ARGV[1]
redis.call('ZREM', KEYS[2], name)
redis.call('HDEL', KEYS[3], name)
redis.call('HDEL', KEYS[4], name)
return redis.call('HDEL', KEYS[1], name)
