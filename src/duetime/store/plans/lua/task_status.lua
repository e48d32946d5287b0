-- task_status: where one task is, read in one atomic step.
-- KEYS[1] tasks           HASH
-- KEYS[2] scheduled       ZSET
-- KEYS[3] ready           LIST
-- KEYS[4] dead            ZSET
-- KEYS[5] attempts        HASH
-- KEYS[6] errors          HASH
-- KEYS[7] result key of this task
-- KEYS[8] delayed_layout  HASH  generation, tasks
-- KEYS[9] flow records   HASH  task id -> its flow record (flow_records.lua)
-- KEYS[10] due           ZSET  due tasks of a queue under flow control (flow.lua)
-- KEYS[11] cancelling    HASH  task id -> when its cancel was asked (cancelling.lua)
-- KEYS[12..] the task's delayed bucket in each generation, 0 to ARGV[2]
-- ARGV[1] task id
-- ARGV[2] the current generation of delayed buckets, as the caller knows it
-- Returns: {state, score (ms) or false, attempts or false, error record or false,
--           envelope or false, result blob or false, flow record or false, 1 when the
--           task waits in the due set (flow control) else 0, when (ms) its cancel was
--           asked or false}; state is one of
-- 'scheduled', 'ready', 'running', 'dead', 'finished' (only a stored result is left)
-- or 'unknown'. Or the current generation (an integer) when ARGV[2] is not it: call
-- again with its buckets.
-- @include delayed_buckets
-- @include microseconds
-- @include flow_records
local id = ARGV[1]
local envelope = redis.call('HGET', KEYS[1], id)
local attempts = redis.call('HGET', KEYS[5], id) or false
local error_record = redis.call('HGET', KEYS[6], id) or false
local result = redis.call('LINDEX', KEYS[7], 0) or false
if not envelope then
  return {result and 'finished' or 'unknown', false, false, false, false, result, false, 0, false}
end
local generation = current_generation(KEYS[8])
if generation ~= tonumber(ARGV[2]) then
  return generation
end
local record = redis.call('HGET', KEYS[9], id) or false
local score = delayed_score(id, 12)
score = score and ms_text(score) or redis.call('ZSCORE', KEYS[2], id)
if score then
  return {'scheduled', score, attempts, error_record, envelope, result, record, 0, false}
end
score = redis.call('ZSCORE', KEYS[4], id)
if score then
  return {'dead', score, attempts, error_record, envelope, result, record, 0, false}
end
if redis.call('LPOS', KEYS[3], id) then
  return {'ready', false, attempts, error_record, envelope, result, record, 0, false}
end
if due_member_of(KEYS[9], KEYS[10], id) then
  return {'ready', false, attempts, error_record, envelope, result, record, 1, false}
end
return {'running', false, attempts, error_record, envelope, result, record, 0,
  redis.call('HGET', KEYS[11], id) or false}
