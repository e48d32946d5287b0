-- schedule_task: store one new task unless its id is already live: schedule_tasks for
-- the one task of a single call, in fewer steps (the arguments as they are, no msgpack,
-- no lists). HEXISTS then HSET rather than HSETNX: the documented ACL lines of
-- producers made before this script do not grant HSETNX.
-- KEYS[1] tasks           HASH  task id -> envelope
-- KEYS[2] scheduled       ZSET  task id -> run-at (ms)
-- KEYS[3] ready           LIST  task ids due now
-- KEYS[4] wake            LIST  one-element signal a sleeping dispatcher blocks on
-- KEYS[5] stats           HASH  counters
-- KEYS[6] delayed         ZSET  bucket name -> earliest run-at in that bucket (µs)
-- KEYS[7] delayed_layout  HASH  generation, tasks (how many the buckets hold)
-- KEYS[8] limits          HASH  flow control (flow.lua): while it exists, a task due now
--         goes among the due, by rank and group, rather than to ready
-- KEYS[9] flow records    HASH  task id -> "<priority>|<cost>||<group>" (flow.lua)
-- KEYS[10] due            ZSET  (flow.lua)
-- KEYS[11] turns          ZSET  (flow.lua)
-- KEYS[12] throttled      ZSET  (flow.lua)
-- KEYS[13] rate state     ZSET  (flow.lua)
-- KEYS[14] running        ZSET  (flow.lua)
-- KEYS[15] leases         ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[16] holds          HASH  (flow.lua): a key refused for a slot is noted
-- KEYS[17] the task's delayed bucket in generation ARGV[6] (ZSET task id -> run-at in
--         µs), named KEYS[6] .. ':' .. "<generation>:<bucket>"
-- ARGV[1] now (ms, server clock)
-- ARGV[2] task id
-- ARGV[3] run-at (ms)
-- ARGV[4] envelope
-- ARGV[5] run-at as the text of whole µs, as the buckets keep it
-- ARGV[6] the generation the bucket was picked in
-- ARGV[7] the task's flow record, or '' (none: priority 0, cost 1, no limit key); a
--         record puts the queue under flow control
-- Returns as schedule_tasks does for one task: {generation, 1, {1}} when the id was
-- already live (nothing changed), else {generation, 1, {}}.
-- @include microseconds
-- @include wake
-- @include scheduling
-- @include flow_mode
-- @include flow_schedule
local now, id, run_at, asked = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[6])
if redis.call('HEXISTS', KEYS[1], id) == 1 then
  return {count_delayed(asked, 0, read_layout(KEYS[7]), KEYS[7], KEYS[6]), 1, {1}}
end
-- Every key written below is read first, or is the first write (see scheduling.lua).
local layout = read_layout(KEYS[7])
local record = ARGV[7] or ''
local flowing = flow_mode(KEYS[8], KEYS[9], record ~= '')
if run_at <= now and not flowing then
  redis.call('RPUSH', KEYS[3], id)
  redis.call('HSET', KEYS[1], id, ARGV[4])
  count_scheduled(KEYS[5], 1)
  return {count_delayed(asked, 0, layout, KEYS[7], KEYS[6]), 1, {}}
end
if run_at <= now then
  -- Under flow control a task due now joins the due set in this call, as a plain one
  -- joins ready: a worker can start it (within its limits) with no dispatcher pass.
  probe_file_now(KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15],
    KEYS[4], KEYS[3], KEYS[16])
  enter_flow(KEYS[8], KEYS[9], id, record, now)
  redis.call('HSET', KEYS[1], id, ARGV[4])
  file_now(KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15],
    KEYS[4], KEYS[3], KEYS[16], {id}, {run_at}, now)
  count_scheduled(KEYS[5], 1)
  return {count_delayed(asked, 0, layout, KEYS[7], KEYS[6]), 1, {}}
end
local wake = must_wake(KEYS[4], comes_first(run_at, KEYS[6], KEYS[2]))
local delayed = 0
enter_flow(KEYS[8], KEYS[9], id, record, now)
if run_at * 1000 >= MOST_US then
  redis.call('ZADD', KEYS[2], run_at, id)
else
  redis.call('ZADD', KEYS[17], ARGV[5], id)
  -- LT: a bucket's score only ever moves earlier here (a new bucket is added).
  redis.call('ZADD', KEYS[6], 'LT', ARGV[5], string.sub(KEYS[17], #KEYS[6] + 2))
  delayed = 1
end
redis.call('HSET', KEYS[1], id, ARGV[4])
count_scheduled(KEYS[5], 1)
if wake then
  redis.call('RPUSH', KEYS[4], 1)
end
return {count_delayed(asked, delayed, layout, KEYS[7], KEYS[6]), 1, {}}
