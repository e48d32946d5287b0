-- debounce_task: one call of a debounced key, in one atomic step. While the key's task
-- has not started and its run-at is ahead, the call joins it: the run-at moves to the
-- call's run-at plus the window, never past the deadline the first call fixed (its
-- run-at plus max_wait), and the task's data becomes the call's (collect 'last') or
-- gains it at the end of its list (collect 'all'). Otherwise the call makes a new task,
-- due a window after the call's run-at, and the key's record names it. A task that has
-- started (or was moved by hand: another envelope) is never changed.
-- With collect 'all', a task holding ``most`` calls, or whose list would pass the byte
-- limit, becomes due now with what it holds, and the call makes a new task.
-- KEYS[1] tasks           HASH  task id -> envelope
-- KEYS[2] scheduled       ZSET  task id -> run-at (ms): where keyed tasks wait
-- KEYS[3] ready           LIST
-- KEYS[4] wake            LIST  one-element signal a sleeping dispatcher blocks on
-- KEYS[5] stats           HASH  counters ("debounced": calls that joined a task)
-- KEYS[6] delayed         ZSET  bucket name -> earliest run-at in that bucket (µs)
-- KEYS[7] limits          HASH  flow control (flow_mode.lua)
-- KEYS[8] flow records    HASH  task id -> its flow record (flow_records.lua)
-- KEYS[9] due             ZSET  due tasks of a queue under flow control (flow.lua)
-- KEYS[10] early          HASH  task id -> run-at, for ids promoted ahead of it
-- KEYS[11] attempts       HASH  task id -> attempts started (a task there has started)
-- KEYS[12] keyed          HASH  "<mode>:<key>" -> the key's record (keyed.lua)
-- KEYS[13] keyed_expiry   ZSET  "<mode>:<key>" -> when the record means nothing more (ms)
-- KEYS[14] keyed_tasks    HASH  task id -> the "<mode>:<key>" whose record names it
-- KEYS[15] dead           ZSET  (not used here: the three keyed scripts take one list)
-- KEYS[16] turns          ZSET  (flow.lua)
-- KEYS[17] throttled      ZSET  (flow.lua)
-- KEYS[18] rate state     ZSET  (flow.lua)
-- KEYS[19] running        ZSET  (flow.lua)
-- KEYS[20] leases         ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[21] holds          HASH  (flow.lua): a key refused for a slot is noted
-- ARGV[1] now (ms, server clock)
-- ARGV[2] the field: "d:" .. the key
-- ARGV[3] the id of a task made by this call (generated; refused when live)
-- ARGV[4] the call's run-at (whole ms, not before now)
-- ARGV[5] envelope head: array header, version and task name, as msgpack
-- ARGV[6] the call's data, as msgpack
-- ARGV[7] envelope limits (max_attempts, timeout, result TTL) after the run-at, or ''
-- ARGV[8] the call's flow record, or ''
-- ARGV[9] the window (ms)
-- ARGV[10] max_wait (ms), 0 for none
-- ARGV[11] collect: 'last' or 'all'
-- ARGV[12] most calls one task collects ('all')
-- ARGV[13] most bytes of a task's collected list ('all')
-- The record: "<task id>|<run-at>|<deadline or ''>|<calls>|<envelope length>|<head
-- length>|<tail length>|<collect>".
-- Returns {'created' or 'collapsed', task id, run-at (ms), calls the task carries,
-- deadline (ms) or false}; {'collided'} when ARGV[3] is live (nothing written: call again
-- with another id); {'collect', the task's collect} when the waiting task collects
-- otherwise than this call asks (nothing written).
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- @include keyed
-- @include keyed_records
-- @include scheduling
-- @include flow_mode
-- @include flow_schedule
local now, field, new_id, base = tonumber(ARGV[1]), ARGV[2], ARGV[3], tonumber(ARGV[4])
local window, max_wait, collect = tonumber(ARGV[9]), tonumber(ARGV[10]), ARGV[11]
-- Every key written below is read first (read_keyed, keyed.lua). Under flow control a task
-- made due now joins the due set in this call (file_now, flow_schedule.lua), as a plain
-- one joins ready.
local record = read_keyed(KEYS[12], KEYS[13], KEYS[14], KEYS[2], KEYS[7], KEYS[8], KEYS[9],
  KEYS[16], KEYS[17], KEYS[18], KEYS[19], KEYS[20], KEYS[4], KEYS[3], KEYS[21], field)
if redis.call('HEXISTS', KEYS[1], new_id) == 1 then
  return {'collided'}
end
local parts = record and split_record(record) or {}
local current = tonumber(parts[2])
local envelope, place = nil, false
if #parts == 8 and current and current > now then
  envelope = redis.call('HGET', KEYS[1], parts[1])
  if written_by_key(envelope, parts[5], parts[7], current)
      and redis.call('HEXISTS', KEYS[11], parts[1]) == 0 then
    place = waiting_place(KEYS[2], KEYS[3], KEYS[8], KEYS[9], parts[1])
  end
end
if place then
  if parts[8] ~= collect then
    return {'collect', parts[8]}
  end
  local id, head_length, tail_length = parts[1], tonumber(parts[6]), tonumber(parts[7])
  local limits = string.sub(envelope, #envelope - tail_length + 10)
  local data = ARGV[6]
  local full = false
  if collect == 'all' then
    local held = string.sub(envelope, head_length + 1, #envelope - tail_length)
    local count, header = array_count(held)
    full = not count or count + 1 > tonumber(ARGV[12]) or #held + #data + 2 > tonumber(ARGV[13])
    if not full then
      data = array_head(count + 1) .. string.sub(held, header + 1) .. data
    end
  end
  if not full then
    local deadline = tonumber(parts[3])
    local run_at = math.max(current, base + window)
    if deadline then
      run_at = math.min(run_at, deadline)
    end
    local first = place ~= 'scheduled' and comes_first(run_at, KEYS[6], KEYS[2])
    postpone(KEYS[2], KEYS[3], KEYS[9], KEYS[10], KEYS[4], place, id, run_at, first)
    local written = string.sub(envelope, 1, head_length) .. data .. packed_ms(run_at) .. limits
    redis.call('HSET', KEYS[1], id, written)
    parts[2], parts[4], parts[5] = run_at, tonumber(parts[4]) + 1, #written
    keep_record(KEYS[12], KEYS[13], field, parts, run_at)
    redis.pcall('HINCRBY', KEYS[5], 'debounced', 1)
    return {'collapsed', id, run_at, parts[4], deadline or false}
  end
  -- Full: what it holds is due now (a run-at moved earlier, to now: never early), in
  -- ready, or under flow control among the due at once (file_now, flow_schedule.lua).
  local flowing = flow_mode(KEYS[7], KEYS[8], false)
  if place == 'ready' then
    redis.call('LREM', KEYS[3], 1, id)
  elseif place ~= 'scheduled' then
    redis.call('ZREM', KEYS[9], place)
  end
  redis.call('ZREM', KEYS[2], id)
  redis.pcall('HDEL', KEYS[10], id)
  local due_now = string.sub(envelope, 1, #envelope - tail_length) .. packed_ms(now) .. limits
  redis.call('HSET', KEYS[1], id, due_now)
  if flowing then
    file_now(KEYS[7], KEYS[8], KEYS[9], KEYS[16], KEYS[17], KEYS[18], KEYS[19], KEYS[20],
      KEYS[4], KEYS[3], KEYS[21], {id}, {now}, now)
  else
    redis.call('RPUSH', KEYS[3], id)
  end
end
local deadline = max_wait > 0 and base + max_wait or false
local run_at = base + window
local data = collect == 'all' and array_head(1) .. ARGV[6] or ARGV[6]
local written = ARGV[5] .. data .. packed_ms(run_at) .. ARGV[7]
create_task(KEYS[1], KEYS[2], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[16],
  KEYS[17], KEYS[18], KEYS[19], KEYS[20], KEYS[4], KEYS[3], KEYS[21], new_id, run_at,
  now, written, ARGV[8])
forget_keyed_task(KEYS[14], field, parts[1])
redis.call('HSET', KEYS[14], new_id, field)
keep_record(KEYS[12], KEYS[13], field,
  {new_id, run_at, deadline or '', 1, #written, #ARGV[5], 9 + #ARGV[7], collect}, run_at)
return {'created', new_id, run_at, 1, deadline}
