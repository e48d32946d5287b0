-- reschedule_task: give a waiting task a new run-at and envelope (compare-and-set).
-- KEYS[1] tasks           HASH
-- KEYS[2] scheduled       ZSET
-- KEYS[3] ready           LIST
-- KEYS[4] dead            ZSET
-- KEYS[5] wake            LIST
-- KEYS[6] early           HASH  task id -> run-at, for ids promoted ahead of it
-- KEYS[7] delayed         ZSET  bucket name -> earliest run-at in that bucket (µs)
-- KEYS[8] delayed_layout  HASH  generation, tasks
-- KEYS[9] flow records   HASH  task id -> its flow record (flow_records.lua)
-- KEYS[10] due           ZSET  due tasks of a queue under flow control (flow.lua)
-- KEYS[11] limits         HASH  flow control (flow.lua: config_key)
-- KEYS[12..] the task's delayed bucket in each generation, 0 to ARGV[6]; the last one
--         (the current generation's) is where it goes when it is due later
-- ARGV[1] now (ms)
-- ARGV[2] task id
-- ARGV[3] new run-at (ms)
-- ARGV[4] the envelope the caller read
-- ARGV[5] the new envelope
-- ARGV[6] the current generation of delayed buckets, as the caller knows it
-- ARGV[7] the new run-at as the text of whole µs (as the buckets keep it)
-- Returns: 'ok'; 'changed' when the envelope changed since it was read (read again and
-- retry); 'running' or 'dead' when the task is not waiting; false when there is no such
-- task; or the current generation (an integer) when ARGV[6] is not it: call again with
-- its buckets.
-- Under flow control (KEYS[11] exists) a task made due now goes to scheduled at its
-- run-at and wakes a dispatcher, which files it among its key's due tasks by rank and
-- gives its key a turn, as schedule_task does (into ready it would skip the turns).
-- Ready holds one due task there for a blocked worker: when the task taken from ready
-- leaves it empty while tasks are due, the script rings KEYS[5] too, and the
-- dispatcher's pass puts one that may start there.
-- @include probes
-- @include delayed_buckets
-- @include microseconds
-- @include wake
-- @include flow_records
local now, id, run_at = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local current = redis.call('HGET', KEYS[1], id)
if not current then
  return false
end
if current ~= ARGV[4] then
  return 'changed'
end
local generation = current_generation(KEYS[8])
if generation ~= tonumber(ARGV[6]) then
  return generation
end
-- Each place the task is taken from is written only if the id is there; what is written
-- after it is read here first: a key of the wrong type fails the call with nothing
-- written (a script that fails half way keeps the writes it made).
probe_zsets(KEYS[2], KEYS[7], KEYS[#KEYS])
probe_lists(KEYS[3], KEYS[5])
probe_hashes(KEYS[6])
local flowing = redis.call('EXISTS', KEYS[11]) == 1
local due = due_member_of(KEYS[9], KEYS[10], id)
if not remove_delayed(id, 12, KEYS[7], KEYS[8]) and redis.call('ZREM', KEYS[2], id) == 0 then
  if redis.call('ZSCORE', KEYS[4], id) then
    return 'dead'
  end
  if due then
    redis.call('ZREM', KEYS[10], due)
  elseif redis.call('LREM', KEYS[3], 1, id) == 0 then
    return 'running'
  end
end
redis.pcall('HDEL', KEYS[6], id) -- a note of a ready, retried or re-entered task
redis.call('HSET', KEYS[1], id, ARGV[5])
if run_at <= now and flowing then
  redis.call('ZADD', KEYS[2], run_at, id)
  forget_layout_if_empty(KEYS[7], KEYS[8])
  wake_if(KEYS[5], true)
elseif run_at <= now then
  redis.call('RPUSH', KEYS[3], id)
  forget_layout_if_empty(KEYS[7], KEYS[8])
else
  local retry = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  local bucket = redis.call('ZRANGE', KEYS[7], 0, 0, 'WITHSCORES')
  local earliest = math.min(tonumber(retry[2]) or math.huge,
    bucket[2] and tonumber(bucket[2]) / 1000 or math.huge)
  if tonumber(ARGV[7]) >= MOST_US then
    redis.call('ZADD', KEYS[2], run_at, id)
    forget_layout_if_empty(KEYS[7], KEYS[8])
  else
    redis.call('ZADD', KEYS[#KEYS], ARGV[7], id)
    redis.call('ZADD', KEYS[7], 'LT', ARGV[7], string.sub(KEYS[#KEYS], #KEYS[7] + 2))
    redis.pcall('HINCRBY', KEYS[8], 'tasks', 1)
  end
  wake_if(KEYS[5], run_at < earliest)
end
if flowing then
  wake_if(KEYS[5], redis.call('LLEN', KEYS[3]) == 0 and redis.call('EXISTS', KEYS[10]) == 1)
end
return 'ok'
