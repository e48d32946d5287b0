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
-- @include probes
local name = ARGV[1]
-- What is written below is read here first (probes.lua).
probe_hashes(KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[8])
probe_zsets(KEYS[7])
redis.call('ZREM', KEYS[2], name)
redis.call('ZREM', KEYS[7], name)
redis.call('HDEL', KEYS[3], name)
redis.call('HDEL', KEYS[4], name)
redis.call('HDEL', KEYS[5], name)
redis.call('HDEL', KEYS[6], name)
redis.call('HDEL', KEYS[8], name)
return redis.call('HDEL', KEYS[1], name)
