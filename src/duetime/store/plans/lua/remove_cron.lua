-- remove_cron: forget a cron job (ticks already enqueued run as ordinary tasks).
-- KEYS[1] cron       HASH
-- KEYS[2] cron_next  ZSET
-- KEYS[3] cron_last  HASH
-- KEYS[4] cron_held  HASH
-- KEYS[5] cron_state HASH
-- KEYS[6] cron_backfill HASH
-- KEYS[7] cron_backfill_due ZSET
-- KEYS[8] cron_fired HASH
-- ARGV[1] job name
-- Returns: 1 removed, 0 no such job.
local name = ARGV[1]
-- What is written below is read here first: a key of the wrong type fails the call
-- with nothing written (a script that fails half way keeps the writes it made).
redis.call('HGET', KEYS[1], '')
redis.call('HGET', KEYS[3], '')
redis.call('HGET', KEYS[4], '')
redis.call('HGET', KEYS[5], '')
redis.call('HGET', KEYS[6], '')
redis.call('ZSCORE', KEYS[7], '')
redis.call('HGET', KEYS[8], '')
redis.call('ZREM', KEYS[2], name)
redis.call('ZREM', KEYS[7], name)
redis.call('HDEL', KEYS[3], name)
redis.call('HDEL', KEYS[4], name)
redis.call('HDEL', KEYS[5], name)
redis.call('HDEL', KEYS[6], name)
redis.call('HDEL', KEYS[8], name)
return redis.call('HDEL', KEYS[1], name)
