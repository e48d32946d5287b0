-- fire_cron: enqueue a cron job's due ticks and advance its next tick, once, however many
-- dispatchers try: the job's next tick is compared and set (CAS), and tick task ids are
-- deterministic, so a tick is never enqueued twice.
-- KEYS[1] cron_next  ZSET  job name -> next tick (ms)
-- KEYS[2] cron_last  HASH  job name -> task id of the latest fired tick
-- KEYS[3] cron_held  HASH  job name -> a tick held back (overlap = delay)
-- KEYS[4] tasks      HASH
-- KEYS[5] ready      LIST
-- KEYS[6] stats      HASH
-- KEYS[7] limits     HASH  flow control (flow_mode.lua): while it exists, or when a tick
--         has a flow record, ticks go to scheduled (a dispatcher files them by rank and
--         limit key) rather than ready
-- KEYS[8] flow records HASH  task id -> "<priority>|<cost>||<limit key>"
-- KEYS[9] scheduled  ZSET
-- KEYS[10] wake      LIST  rung when ticks go to scheduled, so a dispatcher files them
-- ARGV[1] job name
-- ARGV[2] the next-tick score the caller read (CAS)
-- ARGV[3] the following next tick (ms), or -1 when the expression never fires again
-- ARGV[4] overlap policy: allow | skip | delay
-- ARGV[5] when delaying: the time (ms) to look again; ARGV[6] the tick to hold
-- ARGV[7..] quads for the ticks to enqueue (all due): task id, run-at (ms), envelope,
--         flow record ('' for none)
-- Returns: number of ticks enqueued, or 'stale' (another dispatcher fired it, or the job
-- changed), 'skipped' or 'delayed' (the previous run is still live).
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- @include flow_mode
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
redis.call('ZSCORE', KEYS[9], '')
redis.call('LLEN', KEYS[10])
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
local flowing = flow_mode(KEYS[7], KEYS[8], #ARGV >= 7 and ARGV[10] ~= '')
for i = 7, #ARGV, 4 do
  if redis.call('HSETNX', KEYS[4], ARGV[i], ARGV[i + 2]) == 1 then
    if flowing then
      enter_flow(KEYS[7], KEYS[8], ARGV[i], ARGV[i + 3], ARGV[i + 1])
      redis.call('ZADD', KEYS[9], ARGV[i + 1], ARGV[i])
    else
      redis.call('RPUSH', KEYS[5], ARGV[i])
    end
    count = count + 1
  end
  redis.call('HSET', KEYS[2], name, ARGV[i])
end
if flowing and count > 0 and redis.call('LLEN', KEYS[10]) == 0 then
  redis.call('RPUSH', KEYS[10], 1)
end
advance()
if count > 0 then
  redis.pcall('HINCRBY', KEYS[6], 'cron_fired', count)
  redis.pcall('HINCRBY', KEYS[6], 'scheduled', count)
end
return count
