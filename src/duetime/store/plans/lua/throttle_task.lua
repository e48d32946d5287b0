-- throttle_task: one call of a throttled key, in one atomic step. The first call makes a
-- task at its run-at (the leading run) and opens a window from there. A call whose
-- run-at falls in the window is dropped, or with ``trailing`` folded into one trailing
-- run at the window's end: the first such call makes that task, later ones give it their
-- data (while it has not started). A trailing run opens the next window where it runs:
-- a call in that window folds into the next trailing run, so runs stay a window apart.
-- KEYS[1] tasks           HASH  task id -> envelope
-- KEYS[2] scheduled       ZSET  task id -> run-at (ms): where keyed tasks wait
-- KEYS[3] ready           LIST
-- KEYS[4] wake            LIST  one-element signal a sleeping dispatcher blocks on
-- KEYS[5] stats           HASH  counters ("throttle_dropped", "throttle_folded")
-- KEYS[6] delayed         ZSET  bucket name -> earliest run-at in that bucket (µs)
-- KEYS[7] limits          HASH  flow control (flow_mode.lua)
-- KEYS[8] flow records    HASH  task id -> its flow record (flow_records.lua)
-- KEYS[9] due             ZSET  (flow.lua): a leading run due now joins it at once
-- KEYS[10] early          HASH  (not used here)
-- KEYS[11] attempts       HASH  task id -> attempts started (a task there has started)
-- KEYS[12] keyed          HASH  "<mode>:<key>" -> the key's record (keyed.lua)
-- KEYS[13] keyed_expiry   ZSET  "<mode>:<key>" -> when the record means nothing more (ms)
-- KEYS[14] keyed_tasks    HASH  task id -> the "<mode>:<key>" whose record names it
-- KEYS[15] dead           ZSET  (not used here)
-- KEYS[16] turns          ZSET  (flow.lua)
-- KEYS[17] throttled      ZSET  (flow.lua)
-- KEYS[18] rate state     ZSET  (flow.lua)
-- KEYS[19] running        ZSET  (flow.lua)
-- KEYS[20] leases         ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[21] holds          HASH  (flow.lua): a key refused for a slot is noted
-- ARGV[1] now (ms, server clock)
-- ARGV[2] the field: "t:" .. the key
-- ARGV[3] the id of a task made by this call (generated; refused when live)
-- ARGV[4] the call's run-at (whole ms, not before now)
-- ARGV[5] envelope head: array header, version and task name, as msgpack
-- ARGV[6] the call's data, as msgpack
-- ARGV[7] envelope limits (max_attempts, timeout, result TTL) after the run-at, or ''
-- ARGV[8] the call's flow record, or ''
-- ARGV[9] the window (ms)
-- ARGV[10] '1': fold calls in the window into a trailing run; '0': drop them
-- The record: "<leading task id>|<window end>|<calls in the window>|<trailing task id or
-- ''>|<its envelope length>|<its head length>|<its tail length>".
-- Returns {'created', 'collapsed' or 'dropped', the id of the task that carries the call
-- (dropped: the window's leading run), its run-at (ms) or false, calls in the window,
-- the window's end (ms)}; {'collided'} when ARGV[3] is live (nothing written).
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- @include keyed
-- @include keyed_records
local now, field, new_id, base = tonumber(ARGV[1]), ARGV[2], ARGV[3], tonumber(ARGV[4])
local window, trailing = tonumber(ARGV[9]), ARGV[10] == '1'
-- Every key written below is read first (read_keyed, keyed.lua). Under flow control a task
-- made due now joins the due set in this call (file_now, flow_schedule.lua), as a plain
-- one joins ready.
local record = read_keyed(KEYS[12], KEYS[13], KEYS[14], KEYS[2], KEYS[7], KEYS[8], KEYS[9],
  KEYS[16], KEYS[17], KEYS[18], KEYS[19], KEYS[20], KEYS[4], KEYS[3], KEYS[21], field)
if redis.call('HEXISTS', KEYS[1], new_id) == 1 then
  return {'collided'}
end
local parts = record and split_record(record) or {}
local window_end = #parts == 7 and tonumber(parts[2])

-- A new trailing run at ``run_at`` made for this call, named by the record.
local function trailing_run(run_at, leading, calls, expires)
  local written = ARGV[5] .. ARGV[6] .. packed_ms(run_at) .. ARGV[7]
  create_task(KEYS[1], KEYS[2], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[16],
    KEYS[17], KEYS[18], KEYS[19], KEYS[20], KEYS[4], KEYS[3], KEYS[21], new_id, run_at, now,
    written, ARGV[8])
  redis.call('HSET', KEYS[14], new_id, field)
  keep_record(KEYS[12], KEYS[13], field,
    {leading, run_at, calls, new_id, #written, #ARGV[5], 9 + #ARGV[7]}, expires)
  redis.pcall('HINCRBY', KEYS[5], 'throttle_folded', 1)
  return {'created', new_id, run_at, calls, run_at}
end

if window_end and base < window_end then
  local calls = (tonumber(parts[3]) or 1) + 1
  if not trailing then
    parts[3] = calls
    keep_record(KEYS[12], KEYS[13], field, parts, nil)
    redis.pcall('HINCRBY', KEYS[5], 'throttle_dropped', 1)
    return {'dropped', parts[1], false, calls, window_end}
  end
  local later = parts[4]
  if later ~= '' then
    local envelope = redis.call('HGET', KEYS[1], later)
    if written_by_key(envelope, parts[5], parts[7], window_end)
        and redis.call('HEXISTS', KEYS[11], later) == 0 then
      local head_length, tail_length = tonumber(parts[6]), tonumber(parts[7])
      local written = string.sub(envelope, 1, head_length) .. ARGV[6]
        .. string.sub(envelope, #envelope - tail_length + 1)
      redis.call('HSET', KEYS[1], later, written)
      parts[3], parts[5] = calls, #written
      keep_record(KEYS[12], KEYS[13], field, parts, nil)
      redis.pcall('HINCRBY', KEYS[5], 'throttle_folded', 1)
      return {'collapsed', later, window_end, calls, window_end}
    end
    forget_keyed_task(KEYS[14], field, later)
  end
  return trailing_run(window_end, parts[1], calls, window_end + window)
end
forget_keyed_task(KEYS[14], field, parts[1])
if window_end and trailing and parts[4] ~= '' and base < window_end + window then
  -- The trailing run opens this window where it runs: it leads it.
  return trailing_run(window_end + window, parts[4], 1, window_end + 2 * window)
end
forget_keyed_task(KEYS[14], field, parts[4])
create_task(KEYS[1], KEYS[2], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[16],
  KEYS[17], KEYS[18], KEYS[19], KEYS[20], KEYS[4], KEYS[3], KEYS[21], new_id,
  base, now, ARGV[5] .. ARGV[6] .. packed_ms(base) .. ARGV[7], ARGV[8])
redis.call('HSET', KEYS[14], new_id, field)
keep_record(KEYS[12], KEYS[13], field, {new_id, base + window, 1, '', '', '', ''}, base + window)
return {'created', new_id, base, 1, base + window}
