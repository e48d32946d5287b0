-- fail_task: record a failed attempt; schedule the retry, or move the task to dead.
-- KEYS[1] active     LIST  this worker's processing list
-- KEYS[2] leases     ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[3] attempts   HASH
-- KEYS[4] errors     HASH  task id -> last error record
-- KEYS[5] scheduled  ZSET
-- KEYS[6] dead       ZSET  task id -> time of death (ms)
-- KEYS[7] wake       LIST
-- KEYS[8] stats      HASH
-- KEYS[9] result key (used only when ARGV[7] > 0)
-- KEYS[10] minutes   HASH  "<minute>:<figure>" -> per-minute figures
-- KEYS[11] early     HASH  task id -> the time a retry is due (ms), which its lateness is
--          measured from (the envelope keeps the first run-at)
-- KEYS[12] limits    HASH  flow control (flow.lua: config_key); while it exists, the
--          tasks' slots are freed and a task that may start is put in ready
-- KEYS[13] flow records HASH  (flow.lua)
-- KEYS[14] due          ZSET  (flow.lua)
-- KEYS[15] turns        ZSET  (flow.lua)
-- KEYS[16] throttled    ZSET  (flow.lua)
-- KEYS[17] rate state   ZSET  (flow.lua)
-- KEYS[18] running      ZSET  (flow.lua)
-- KEYS[19] ready     LIST
-- KEYS[20] tasks     HASH  task id -> envelope (the history reads the task's name)
-- KEYS[21] history state HASH  (history.lua)
-- KEYS[22] history       LIST  (history.lua)
-- KEYS[23] history tasks ZSET  (history.lua)
-- KEYS[24] cancelling HASH  task id -> when its cancel was asked (cancelling.lua)
-- ARGV[1] now (ms)
-- ARGV[2] worker id
-- ARGV[3] task id
-- ARGV[4] attempt
-- ARGV[5] error record
-- ARGV[6] retry at (ms), or -1 to move the task to dead
-- ARGV[7] result TTL (ms, 0 = keep none); ARGV[8] result blob (stored only on death)
-- ARGV[9] duration (µs the handler ran), ARGV[10] start lateness (µs): -1 when the
--         handler did not start; ARGV[11] the error text the history keeps (short)
-- ARGV[12] 'expired': the attempt did not start by its task's expiry; the task ends as
--          expired (counted, recorded, never retried). Absent or '': a failure
-- Returns: 1 applied, 0 fenced (lease expired or attempt superseded), 2 the task ended as
-- cancelled instead (its cancel was asked while it ran: no retry, not dead), 3 it ended
-- as expired (ARGV[12]).
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- @include probes
-- @include fence
-- @include wake
-- @include result
-- @include cancelling
-- @include unfinished
-- @include flow_release
-- @include history
local now = tonumber(ARGV[1])
local id = ARGV[3]
local member = ARGV[2] .. '|' .. id
if not holds_lease(KEYS[2], KEYS[3], member, id, ARGV[4], now) then
  redis.pcall('HINCRBY', KEYS[8], 'fenced', 1)
  return 0
end
-- A script that fails half way keeps the writes it made: every key written below is
-- read first (a read of the wrong type fails too), or is the first write (the worker's
-- list), so a key of the wrong type fails the call with nothing written. The result key
-- is replaced whole (DEL first), whatever it held; counters are bumped with pcall.
local retry_at = tonumber(ARGV[6])
local head, wake
probe_hashes(KEYS[4])
local ran = tonumber(ARGV[9]) >= 0
local how = cancels_asked(KEYS[24], {id})[id] and 'cancelled' or ARGV[12] == 'expired' and
  'expired'
if how then
  end_unfinished(KEYS[24], KEYS[1], KEYS[2], KEYS[20], KEYS[3], KEYS[4], KEYS[11], KEYS[8],
    KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16], KEYS[17], KEYS[18], KEYS[7], KEYS[19],
    KEYS[21], KEYS[22], KEYS[23], id, member, ARGV[2], ARGV[4], now, ran and tonumber(ARGV[9]),
    ran and tonumber(ARGV[10]), ARGV[11], how)
  local ttl = tonumber(ARGV[7])
  if ttl > 0 then
    keep_result(KEYS[9], ended_result(now, ARGV[4], how), ttl)
  end
  return how == 'expired' and 3 or 2
end
if retry_at < 0 then
  probe_zsets(KEYS[6])
else
  head = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
  wake = must_wake(KEYS[7], comes_before(retry_at, head))
end
local flowing = flow_to_release(KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16], KEYS[17], KEYS[18],
  KEYS[19])
redis.call('LREM', KEYS[1], 1, id)
redis.call('ZREM', KEYS[2], member)
redis.call('HSET', KEYS[4], id, ARGV[5])
redis.pcall('HINCRBY', KEYS[8], 'failed', 1)
local minute = math.floor(now / 60000) .. ':'
if retry_at < 0 then
  redis.call('ZADD', KEYS[6], now, id)
  redis.pcall('HINCRBY', KEYS[8], 'dead', 1)
  redis.pcall('HINCRBY', KEYS[10], minute .. 'dead', 1)
  local ttl = tonumber(ARGV[7])
  if ttl > 0 then
    keep_result(KEYS[9], ARGV[8], ttl)
  end
else
  redis.call('ZADD', KEYS[5], retry_at, id)
  redis.pcall('HSET', KEYS[11], id, ARGV[6]) -- pcall: a damaged key must not fail the step
  if wake then
    redis.call('RPUSH', KEYS[7], 1)
  end
  redis.pcall('HINCRBY', KEYS[8], 'retried', 1)
  redis.pcall('HINCRBY', KEYS[10], minute .. 'retried', 1)
end
if flowing then
  release_and_feed(KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16], KEYS[17], KEYS[18],
    KEYS[2], KEYS[7], KEYS[19], {id}, {member}, false, now)
end
local history = history_open(KEYS[21])
if history then
  local name = task_name_of(redis.pcall('HGET', KEYS[20], id))
  local outcome = retry_at < 0 and HISTORY_DEAD or HISTORY_RETRIED
  record_history(history, KEYS[21], KEYS[22], KEYS[23], {id}, {history_record(id, name, outcome,
    tonumber(ARGV[4]), now, ARGV[2], ran and tonumber(ARGV[9]),
    ran and math.max(0, tonumber(ARGV[10])), ARGV[11])})
end
return 1
