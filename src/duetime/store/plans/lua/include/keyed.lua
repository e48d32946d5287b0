-- What the keyed modes share: envelopes, where a key's task waits, a new task (keys given).
-- The modes are debounce_task, throttle_task and schedule_unique. Keys are given as
-- parameters; those of flow control (and wake, ready) as file_now takes them
-- (flow_schedule.lua). An envelope is written here from parts the client packed: its head
-- (array header, version and task name), the data, the run-at (whole ms, as a msgpack
-- uint 64) and its limits. A record notes the envelope's length, its head's and its
-- tail's (run-at and limits), so that the data can be cut out again without decoding
-- anything.
-- @include probes
-- @include wake
-- @include scheduling
-- @include flow_records
-- @include flow_mode
-- @include flow_schedule

-- The key's record (``field`` of keyed_key), read with every key the keyed scripts
-- write: a script that fails half way keeps the writes it made, and a read of the wrong
-- type fails too, so a key of the wrong type then fails the call with nothing written.
local function read_keyed(keyed_key, expiry_key, keyed_tasks_key, scheduled_key, config_key,
                          records_key, due_key, turns_key, throttled_key, tats_key,
                          running_key, leases_key, wake_key, ready_key, holds_key, field)
  local record = redis.call('HGET', keyed_key, field)
  probe_zsets(expiry_key, scheduled_key)
  probe_hashes(keyed_tasks_key, config_key)
  probe_file_now(records_key, due_key, turns_key, throttled_key, tats_key, running_key,
    leases_key, wake_key, ready_key, holds_key)
  return record
end

-- Whole ms as a msgpack uint 64 (0xcf and 8 bytes, big-endian): always 9 bytes, so a
-- run-at is rewritten in place.
local function packed_ms(ms)
  local bytes = {}
  for i = 8, 1, -1 do
    bytes[i] = ms % 256
    ms = math.floor(ms / 256)
  end
  return '\207' .. string.char(unpack(bytes))
end

-- The header of a msgpack array of ``count`` elements (at most 65,535).
local function array_head(count)
  if count < 16 then
    return string.char(144 + count)
  end
  return '\220' .. string.char(math.floor(count / 256), count % 256)
end

-- The element count of the msgpack array ``data`` starts with, and its header's length;
-- nil when it does not start with one.
local function array_count(data)
  local first = string.byte(data, 1)
  if first and first >= 144 and first <= 159 then
    return first - 144, 1
  end
  if first == 220 and #data >= 3 then
    return string.byte(data, 2) * 256 + string.byte(data, 3), 3
  end
  return nil, 0
end

-- Whether ``envelope`` is still the one a key's record describes: its length, and its
-- run-at in place. A task rescheduled (or run now) by hand got another envelope: the
-- key leaves it alone from then on.
local function written_by_key(envelope, length, tail_length, run_at)
  if not envelope or #envelope ~= tonumber(length) then
    return false
  end
  local at = #envelope - tonumber(tail_length) + 1
  return string.sub(envelope, at, at + 8) == packed_ms(run_at)
end

-- Where a task that never started waits: 'scheduled', 'ready', or its member in the due
-- set (flow control); false when it is in none (a worker took it, or it was moved into
-- a delayed bucket by hand). Reads only.
local function waiting_place(scheduled_key, ready_key, records_key, due_key, id)
  if redis.call('ZSCORE', scheduled_key, id) then
    return 'scheduled'
  end
  if redis.call('LPOS', ready_key, id) then
    return 'ready'
  end
  return due_member_of(records_key, due_key, id)
end

-- Move a task waiting at ``place`` (waiting_place) to ``scheduled`` at ``run_at`` (ms,
-- after now). One taken back from ready or the due set drops its early note, and wakes
-- a dispatcher (``first``: comes_first, asked before the script's first write) when it
-- is now the earliest.
local function postpone(scheduled_key, ready_key, due_key, early_key, wake_key, place, id,
                        run_at, first)
  if place ~= 'scheduled' then
    if place == 'ready' then
      redis.call('LREM', ready_key, 1, id)
    else
      redis.call('ZREM', due_key, place)
    end
    redis.pcall('HDEL', early_key, id)
    wake_if(wake_key, first)
  end
  redis.call('ZADD', scheduled_key, run_at, id)
end

-- Write a new task due at ``run_at`` (ms): when due, to ready, or under flow control
-- among the due at once (file_now: a worker can start it with no dispatcher pass); else
-- to scheduled (a dispatcher promotes it; it is woken when the task comes first).
-- ``record``: its flow record, '' for none. Returns where it went: 'ready' (due now,
-- either way) or 'scheduled'.
local function create_task(tasks_key, scheduled_key, stats_key, index_key, config_key,
                           records_key, due_key, turns_key, throttled_key, tats_key,
                           running_key, leases_key, wake_key, ready_key, holds_key, id, run_at,
                           now, envelope, record)
  local flowing = flow_mode(config_key, records_key, record ~= '')
  if run_at <= now and not flowing then
    redis.call('RPUSH', ready_key, id)
    redis.call('HSET', tasks_key, id, envelope)
  elseif run_at <= now then
    enter_flow(config_key, records_key, id, record, now)
    redis.call('HSET', tasks_key, id, envelope)
    file_now(config_key, records_key, due_key, turns_key, throttled_key, tats_key, running_key,
      leases_key, wake_key, ready_key, holds_key, {id}, {run_at}, now)
  else
    local wake = must_wake(wake_key, comes_first(run_at, index_key, scheduled_key))
    enter_flow(config_key, records_key, id, record, now)
    redis.call('ZADD', scheduled_key, run_at, id)
    if wake then
      redis.call('RPUSH', wake_key, 1)
    end
    redis.call('HSET', tasks_key, id, envelope)
  end
  count_scheduled(stats_key, 1)
  return run_at <= now and 'ready' or 'scheduled'
end
