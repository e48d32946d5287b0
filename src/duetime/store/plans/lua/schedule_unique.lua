-- schedule_unique: one call of a unique key, in one atomic step. While the key's task is
-- live (until 'started': it has not started; until 'finished': it is waiting, running or
-- waiting to retry, not dead and not gone) the call writes nothing and answers with that
-- task and its state; otherwise it makes a new task at its run-at, which the key's
-- record names from then on.
-- KEYS[1] tasks           HASH  task id -> envelope
-- KEYS[2] scheduled       ZSET  task id -> run-at (ms): where keyed tasks wait
-- KEYS[3] ready           LIST
-- KEYS[4] wake            LIST  one-element signal a sleeping dispatcher blocks on
-- KEYS[5] stats           HASH  counters ("unique_hits": calls that found a live task)
-- KEYS[6] delayed         ZSET  bucket name -> earliest run-at in that bucket (µs)
-- KEYS[7] limits          HASH  flow control (flow_mode.lua)
-- KEYS[8] flow records    HASH  task id -> its flow record (flow_records.lua)
-- KEYS[9] due             ZSET  due tasks of a queue under flow control (flow.lua)
-- KEYS[10] early          HASH  (not used here: the three keyed scripts take one list)
-- KEYS[11] attempts       HASH  task id -> attempts started (a task there has started)
-- KEYS[12] keyed          HASH  "<mode>:<key>" -> the key's record (keyed.lua)
-- KEYS[13] keyed_expiry   ZSET  "<mode>:<key>" -> when a sweep looks at the record (ms):
--          a new record at once (a dispatcher's next sweep), then as the sweep says
-- KEYS[14] keyed_tasks    HASH  task id -> the "<mode>:<key>" whose record names it
-- KEYS[15] dead           ZSET  task id -> time of death (a dead task is not live)
-- KEYS[16] turns          ZSET  (flow.lua)
-- KEYS[17] throttled      ZSET  (flow.lua)
-- KEYS[18] rate state     ZSET  (flow.lua)
-- KEYS[19] running        ZSET  (flow.lua)
-- KEYS[20] leases         ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[21] holds          HASH  (flow.lua): a key refused for a slot is noted
-- ARGV[1] now (ms, server clock)
-- ARGV[2] the field: "u:" .. the key
-- ARGV[3] the id of a task made by this call (generated; refused when live)
-- ARGV[4] the call's run-at (whole ms, not before now)
-- ARGV[5] envelope head: array header, version and task name, as msgpack
-- ARGV[6] the call's data, as msgpack
-- ARGV[7] envelope limits (max_attempts, timeout, result TTL) after the run-at, or ''
-- ARGV[8] the call's flow record, or ''
-- ARGV[9] until: 'started' or 'finished'
-- The record: "<task id>|<until, as the call that made the task asked>|<hits>".
-- Returns {'created' or 'existing', task id, its state ('scheduled', 'ready' or
-- 'running'), hits: calls that found it live}; {'collided'} when ARGV[3] is live
-- (nothing written).
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- @include keyed
-- @include keyed_records
local now, field, new_id, base = tonumber(ARGV[1]), ARGV[2], ARGV[3], tonumber(ARGV[4])
-- Every key written below is read first (read_keyed, keyed.lua). Under flow control a task
-- made due now joins the due set in this call (file_now, flow_schedule.lua), as a plain
-- one joins ready.
local record = read_keyed(KEYS[12], KEYS[13], KEYS[14], KEYS[2], KEYS[7], KEYS[8], KEYS[9],
  KEYS[16], KEYS[17], KEYS[18], KEYS[19], KEYS[20], KEYS[4], KEYS[3], KEYS[21], field)
local parts = record and split_record(record) or {}
if #parts == 3 and redis.call('HEXISTS', KEYS[1], parts[1]) == 1
    and not redis.call('ZSCORE', KEYS[15], parts[1]) then
  local id = parts[1]
  local started = redis.call('HEXISTS', KEYS[11], id) == 1
  if ARGV[9] == 'finished' or not started then
    local place = waiting_place(KEYS[2], KEYS[3], KEYS[8], KEYS[9], id)
    local state = place == 'scheduled' and 'scheduled' or place and 'ready'
      or started and 'running' or 'scheduled'
    parts[3] = (tonumber(parts[3]) or 0) + 1
    keep_record(KEYS[12], KEYS[13], field, parts, nil)
    redis.pcall('HINCRBY', KEYS[5], 'unique_hits', 1)
    return {'existing', id, state, parts[3]}
  end
end
if redis.call('HEXISTS', KEYS[1], new_id) == 1 then
  return {'collided'}
end
local state = create_task(KEYS[1], KEYS[2], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9],
  KEYS[16], KEYS[17], KEYS[18], KEYS[19], KEYS[20], KEYS[4], KEYS[3], KEYS[21], new_id, base,
  now, ARGV[5] .. ARGV[6] .. packed_ms(base) .. ARGV[7], ARGV[8])
forget_keyed_task(KEYS[14], field, parts[1])
redis.call('HSET', KEYS[14], new_id, field)
keep_record(KEYS[12], KEYS[13], field, {new_id, ARGV[9], 0}, now)
return {'created', new_id, state, 0}
