-- fire_cron: enqueue a cron job's due ticks and advance its next tick, once, however many
-- dispatchers try: the job's next tick is compared and set (CAS), and tick task ids are
-- deterministic, so a tick is never enqueued twice.
-- KEYS[1] cron_next  ZSET  job name -> next tick (ms)
-- KEYS[2] cron_last  HASH  job name -> task id of the latest fired tick
-- KEYS[3] cron_held  HASH  job name -> a tick held back (overlap = delay)
-- KEYS[4] tasks      HASH
-- KEYS[5] ready      LIST
-- KEYS[6] stats      HASH
-- ARGV[1] job name
-- ARGV[2] the next-tick score the caller read (CAS)
-- ARGV[3] the following next tick (ms), or -1 when the expression never fires again
-- ARGV[4] overlap policy: allow | skip | delay
-- ARGV[5] when delaying: the time (ms) to look again; ARGV[6] the tick to hold
-- ARGV[7..] triples for the ticks to enqueue (all due): task id, run-at (ms), envelope
-- Returns: number of ticks enqueued, or 'stale' (another dispatcher fired it, or the job
-- changed), 'skipped' or 'delayed' (the previous run is still live).
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
local name = ARGV[1]
local function advance()
  if tonumber(ARGV[3]) >= 0 then
    redis.call('ZADD', KEYS[1], ARGV[3], name)
  else
    redis.call('ZREM', KEYS[1], name)
  end
  redis.call('HDEL', KEYS[3], name)
end
local score = redis.call('ZSCORE', KEYS[1], name)
if not score or tonumber(score) ~= tonumber(ARGV[2]) then
  return 'stale'
end
-- What is written below is read here first: a key of the wrong type fails the call
-- with nothing written (a script that fails half way keeps the writes it made).
redis.call('HGET', KEYS[2], '')
redis.call('HGET', KEYS[3], '')
redis.call('HGET', KEYS[4], '')
redis.call('LLEN', KEYS[5])
if ARGV[4] ~= 'allow' then
  local last = redis.call('HGET', KEYS[2], name)
  if last and redis.call('HEXISTS', KEYS[4], last) == 1 then
    if ARGV[4] == 'delay' then
      redis.call('ZADD', KEYS[1], ARGV[5], name)
      redis.call('HSET', KEYS[3], name, ARGV[6])
      return 'delayed'
    end
    advance()
    redis.pcall('HINCRBY', KEYS[6], 'cron_skipped', 1)
    return 'skipped'
  end
end
local count = 0
for i = 7, #ARGV, 3 do
  if redis.call('HSETNX', KEYS[4], ARGV[i], ARGV[i + 2]) == 1 then
    redis.call('RPUSH', KEYS[5], ARGV[i])
    count = count + 1
  end
  redis.call('HSET', KEYS[2], name, ARGV[i])
end
advance()
if count > 0 then
  redis.pcall('HINCRBY', KEYS[6], 'cron_fired', count)
  redis.pcall('HINCRBY', KEYS[6], 'scheduled', count)
end
return count
