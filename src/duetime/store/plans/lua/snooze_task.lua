-- snooze_task: a handler asked to be run again later (the remote side said "slow down"):
-- the task waits until ARGV[5] in scheduled, the attempt is given back (it does not
-- count against max_attempts), no error is recorded, the envelope counts one snooze more
-- (the worker ends a task that snoozes past its limit); with ARGV[6] = 1 its limit key
-- (under flow control) also waits until then, so no task of that key starts before.
-- KEYS[1] active     LIST  this worker's processing list
-- KEYS[2] leases     ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[3] attempts   HASH
-- KEYS[4] scheduled  ZSET
-- KEYS[5] wake       LIST
-- KEYS[6] stats      HASH
-- KEYS[7] early      HASH  task id -> when it is due again (its lateness counts from then)
-- KEYS[8] limits     HASH  flow control (flow.lua: config_key)
-- KEYS[9] flow records HASH  (flow.lua)
-- KEYS[10] due          ZSET  (flow.lua)
-- KEYS[11] turns        ZSET  (flow.lua)
-- KEYS[12] throttled    ZSET  (flow.lua)
-- KEYS[13] rate state   ZSET  (flow.lua)
-- KEYS[14] running      ZSET  (flow.lua)
-- KEYS[15] ready     LIST
-- KEYS[16] tasks     HASH  task id -> envelope: its snooze count goes one up (snoozes.lua);
--          the history reads the task's name
-- KEYS[17] history state HASH  (history.lua)
-- KEYS[18] history       LIST  (history.lua)
-- KEYS[19] history tasks ZSET  (history.lua)
-- KEYS[20] cancelling HASH  task id -> when its cancel was asked (cancelling.lua)
-- KEYS[21] errors    HASH  task id -> last error record
-- ARGV[1] now (ms)
-- ARGV[2] worker id
-- ARGV[3] task id
-- ARGV[4] attempt
-- ARGV[5] due again at (ms)
-- ARGV[6] 1: the whole limit key waits too; 0: this task only
-- ARGV[7] duration (µs the handler ran); ARGV[8] start lateness (µs)
-- Returns: 1 applied, 0 fenced (lease expired or attempt superseded), 2 the task ended as
-- cancelled instead (its cancel was asked while it ran).
-- @include fence
-- @include wake
-- @include cancelling
-- @include unfinished
-- @include flow_records
-- @include flow_turns
-- @include flow_release
-- @include history
-- @include snoozes
-- @include snooze_history
local now, id, due_at = tonumber(ARGV[1]), ARGV[3], tonumber(ARGV[5])
local member = ARGV[2] .. '|' .. id
if not holds_lease(KEYS[2], KEYS[3], member, id, ARGV[4], now) then
  redis.pcall('HINCRBY', KEYS[6], 'fenced', 1)
  return 0
end
-- Every key written below is read first: a key of the wrong type fails the call with
-- nothing written (a script that fails half way keeps the writes it made).
if cancels_asked(KEYS[20], {id})[id] then
  end_unfinished(KEYS[20], KEYS[1], KEYS[2], KEYS[16], KEYS[3], KEYS[21], KEYS[7], KEYS[6],
    KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[5], KEYS[15],
    KEYS[17], KEYS[18], KEYS[19], id, member, ARGV[2], ARGV[4], now, tonumber(ARGV[7]),
    tonumber(ARGV[8]), false, 'cancelled')
  return 2
end
local envelope = redis.call('HGET', KEYS[16], id)
local wake = must_wake(KEYS[5], comes_before(due_at,
  redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')))
local flowing = flow_to_release(KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14],
  KEYS[15])
redis.call('LREM', KEYS[1], 1, id)
redis.call('ZREM', KEYS[2], member)
-- The attempt is given back, as when a worker hands a task back on shutdown.
local started = tonumber(redis.call('HGET', KEYS[3], id) or '0') or 1
if started > 1 then
  redis.call('HSET', KEYS[3], id, started - 1)
else
  redis.call('HDEL', KEYS[3], id)
end
redis.call('ZADD', KEYS[4], due_at, id)
local counted = snoozed_envelope(envelope)
if counted then
  redis.call('HSET', KEYS[16], id, counted)
end
redis.pcall('HSET', KEYS[7], id, ARGV[5]) -- pcall: a damaged key must not fail the step
redis.pcall('HINCRBY', KEYS[6], 'snoozed', 1)
if flowing then
  if ARGV[6] == '1' then
    local _, _, _, group = parse_record(redis.call('HGET', KEYS[9], id))
    redis.call('ZREM', KEYS[11], group)
    throttle(KEYS[12], KEYS[5], group, due_at)
  end
  release_and_feed(KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14],
    KEYS[2], KEYS[5], KEYS[15], {id}, {member}, false, now)
end
if wake and redis.call('LLEN', KEYS[5]) == 0 then
  redis.call('RPUSH', KEYS[5], 1)
end
local history = history_open(KEYS[17])
if history then
  record_snooze(history, KEYS[17], KEYS[18], KEYS[19], id, history_record(id,
    task_name_of(envelope), HISTORY_SNOOZED, tonumber(ARGV[4]), now, ARGV[2],
    math.max(0, tonumber(ARGV[7])), math.max(0, tonumber(ARGV[8]))), now)
end
return 1
