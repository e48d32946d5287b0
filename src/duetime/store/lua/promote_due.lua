-- promote_due: move due task ids from scheduled to ready, at most ARGV[3] per call.
-- KEYS[1] scheduled  ZSET  task id -> run-at (ms)
-- KEYS[2] ready      LIST
-- KEYS[3] leases     ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[4] stats      HASH
-- KEYS[5] workers    ZSET  worker id -> last heartbeat (ms)
-- KEYS[6] cron_next  ZSET  cron job name -> next tick (ms)
-- KEYS[7] early      HASH  task id -> run-at (ms), for ids moved before their run-at
-- KEYS[8] reaped     ZSET  reaped worker id -> when to look at its list once more (ms)
-- ARGV[1] now (ms, server clock)
-- ARGV[2] promote ids due up to this time (ms, >= now): moving a task a few ms ahead
--         takes the hand-over to a worker off its critical path; the run-at goes along
--         in `early`, and the claiming worker waits for it, so no task starts early.
-- ARGV[3] most ids to move
-- Returns: {moved count, next run-at or -1, earliest lease deadline or -1, oldest worker
-- heartbeat or -1, next cron tick or -1, next look at a reaped worker's list or -1}, so
-- the caller knows how long it may sleep without another round trip.
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
local now = tonumber(ARGV[1])
local due = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[2], 'BYSCORE', 'LIMIT', 0, ARGV[3],
  'WITHSCORES')
local ids, ahead = {}, {}
for i = 1, #due, 2 do
  ids[#ids + 1] = due[i]
  if tonumber(due[i + 1]) > now then
    ahead[#ahead + 1] = due[i]
    ahead[#ahead + 1] = due[i + 1]
  end
end
if #ids > 0 then
  -- RPUSH first: if it fails (ready of the wrong type) nothing has been removed yet.
  redis.call('RPUSH', KEYS[2], unpack(ids))
  if #ahead > 0 then
    redis.call('HSET', KEYS[7], unpack(ahead))
  end
  redis.call('ZREM', KEYS[1], unpack(ids))
  redis.pcall('HINCRBY', KEYS[4], 'promoted', #ids)
end
local next_due = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local next_lease = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
local oldest_beat = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
local next_tick = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
local next_look = redis.call('ZRANGE', KEYS[8], 0, 0, 'WITHSCORES')
return {#ids, next_due[2] or '-1', next_lease[2] or '-1', oldest_beat[2] or '-1',
  next_tick[2] or '-1', next_look[2] or '-1'}
