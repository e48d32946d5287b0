-- cancel_task: remove a task that has not started (or is dead), leaving nothing behind.
-- KEYS[1] tasks           HASH
-- KEYS[2] scheduled       ZSET
-- KEYS[3] ready           LIST
-- KEYS[4] dead            ZSET
-- KEYS[5] attempts        HASH
-- KEYS[6] errors          HASH
-- KEYS[7] stats           HASH
-- KEYS[8] early           HASH  task id -> run-at, for ids promoted ahead of it
-- KEYS[9] delayed         ZSET  bucket name -> earliest run-at in that bucket
-- KEYS[10] delayed_layout HASH  generation, tasks
-- KEYS[11] flow records  HASH  task id -> its flow record (flow_records.lua)
-- KEYS[12] due            ZSET  due tasks of a queue under flow control (flow.lua)
-- KEYS[13] history state HASH  (history.lua)
-- KEYS[14] history       LIST  (history.lua)
-- KEYS[15] history tasks ZSET  (history.lua)
-- KEYS[16] cancelling HASH  task id -> when its cancel was asked (cancelling.lua)
-- KEYS[17] wake         LIST  the dispatchers' alarm (wake.lua)
-- KEYS[18..] the task's delayed bucket in each generation, 0 to ARGV[2]
-- ARGV[1] task id
-- ARGV[2] the current generation of delayed buckets, as the caller knows it
-- ARGV[3] now (ms): when the history records the cancel
-- ARGV[4] '1': only a waiting task (scheduled or ready); a dead one is left alone
--         (absent or '0': a dead one is removed too)
-- ARGV[5] '1': a running task's cancel is asked (its id is marked in KEYS[16], and the
--         step that ends its attempt ends it as cancelled); '0': it is left alone
-- ARGV[6] the queue's cancel channel (a channel, not a key): a running task's id marked
--         is published there, so that its worker stops it at once
-- Returns: the place it was removed from ('scheduled', 'ready', 'dead'), 'running' when it
-- is running (marked with ARGV[5] '1', else left alone), 'dead' with ARGV[4] '1' when it
-- is dead (left alone), false
-- when no live task has this id, or the current generation (an integer) when ARGV[2] is
-- not it: call again with its buckets.
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- A cancelled task is recorded in the history (attempt: the attempts it had started).
-- Under flow control ready holds one due task, there for a blocked worker to wake to: a
-- cancel that takes it while others are due rings KEYS[17], and the dispatcher's pass
-- puts another in its place.
-- @include probes
-- @include delayed_buckets
-- @include flow_records
-- @include history
local id = ARGV[1]
local envelope = redis.call('HGET', KEYS[1], id)
if not envelope then
  return false
end
local generation = current_generation(KEYS[10])
if generation ~= tonumber(ARGV[2]) then
  return generation
end
-- Each place below is written only if the id is there; what is written after it is read
-- here first: a key of the wrong type fails the call with nothing written (a script
-- that fails half way keeps the writes it made).
probe_zsets(KEYS[9])
probe_hashes(KEYS[5], KEYS[6], KEYS[8], KEYS[11], KEYS[16])
probe_lists(KEYS[17])
local due = due_member_of(KEYS[11], KEYS[12], id)
local place
if remove_delayed(id, 18, KEYS[9], KEYS[10]) then
  place = 'scheduled'
  forget_layout_if_empty(KEYS[9], KEYS[10])
elseif redis.call('ZREM', KEYS[2], id) == 1 then
  place = 'scheduled'
elseif ARGV[4] == '1' and redis.call('ZSCORE', KEYS[4], id) then
  return 'dead'
elseif redis.call('ZREM', KEYS[4], id) == 1 then
  place = 'dead'
elseif redis.call('LREM', KEYS[3], 1, id) == 1 then
  place = 'ready'
  if redis.call('LLEN', KEYS[3]) == 0 and redis.call('EXISTS', KEYS[12]) == 1
      and redis.call('LLEN', KEYS[17]) == 0 then
    redis.call('RPUSH', KEYS[17], 1)
  end
elseif due then
  redis.call('ZREM', KEYS[12], due)
  place = 'ready'
else
  if ARGV[5] == '1' then
    redis.call('HSET', KEYS[16], id, ARGV[3])
    -- The worker holding it hears of it at once when it listens, else at its next
    -- heartbeat (which reads the mark). pcall: a client not granted the channel (ACL)
    -- still cancels.
    redis.pcall('PUBLISH', ARGV[6], id)
  end
  return 'running'
end
redis.call('HDEL', KEYS[16], id) -- a mark left by a cancel of an attempt since ended
local attempts = tonumber(redis.call('HGET', KEYS[5], id)) or 0
redis.pcall('HDEL', KEYS[8], id) -- a note of a ready, retried or re-entered task
redis.call('HDEL', KEYS[1], id)
redis.call('HDEL', KEYS[5], id)
redis.call('HDEL', KEYS[6], id)
redis.call('HDEL', KEYS[11], id)
redis.pcall('HINCRBY', KEYS[7], 'cancelled', 1)
record_history(history_open(KEYS[13]), KEYS[13], KEYS[14], KEYS[15], {id},
  {history_record(id, task_name_of(envelope), HISTORY_CANCELLED, attempts, tonumber(ARGV[3]))})
return place
