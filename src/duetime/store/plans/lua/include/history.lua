-- The history of finished attempts: how it is kept and written (state_key, log_key, index_key).
-- A capped record, written by the script that ends each attempt. Three keys, given as
-- parameters:
--   state_key  HASH  "size": how many entries to keep (absent: HISTORY_DEFAULT_SIZE;
--                    0: off), "seq": the number of the newest entry
--   log_key    LIST  the entries, newest first: entry number seq is at index
--                    (state.seq - seq); the first "size" are the history, and the
--                    log is trimmed back to them once it holds HISTORY_TRIM_STEP more
--                    (one trim per so many entries, not one per ack)
--   index_key  ZSET  task id -> the number of its newest entry; each entry names the
--                    one before it of the same task, so a task's entries are found
--                    without a scan
-- An entry is "<number of the task's entry before it, or nothing>|<record>", the record a
-- msgpack array whose trailing empty elements are left out: task id, task name (false:
-- the envelope could not be read), outcome (the HISTORY_* codes), attempt, finished at
-- (ms), worker, duration (µs), lateness (µs), error text; and for a run of snoozes of one
-- task coalesced into one entry (snooze_history.lua: record_snooze), how many it stands
-- for and when the latest was (ms). The ack's records are packed by the worker (store/history.py:
-- packed_record), the others by history_record here.
-- The history never fails the step that ends an attempt: its keys are read, and first
-- written, with pcall; one that is damaged (a wrong type, a size or number that is not
-- one), a history that is off, or a user not granted its commands leaves it as it is.
-- @include chunks
local HISTORY_DEFAULT_SIZE = 1000
local HISTORY_TRIM_STEP = 64
local HISTORY_SUCCEEDED, HISTORY_RETRIED, HISTORY_DEAD = 1, 2, 3
local HISTORY_SNOOZED, HISTORY_LOST, HISTORY_CANCELLED, HISTORY_EXPIRED = 4, 5, 6, 7

-- The task name at the head of an envelope (msgpack [version, name, ...]), read from its
-- first bytes rather than decoded: the data after it may be large. False for anything
-- that does not start as duetime writes an envelope.
local function task_name_of(envelope)
  if type(envelope) ~= 'string' then
    return false
  end
  local array, version, kind = string.byte(envelope, 1, 3)
  if not kind or array < 0x94 or array > 0x9f or version < 1 or version > 4 then
    return false
  end
  if kind >= 0xa0 and kind <= 0xbf then
    return string.sub(envelope, 4, 3 + kind - 0xa0)
  elseif kind == 0xd9 and #envelope >= 4 then
    return string.sub(envelope, 5, 4 + string.byte(envelope, 4))
  end
  return false
end

-- The record of one ending (see above): worker, duration, lateness and error may be false.
local function history_record(id, name, outcome, attempt, now, worker, duration, lateness, err)
  local record = {id, name or false, outcome, attempt, now, worker or false, duration or false,
    lateness or false, err or false}
  for field = 9, 6, -1 do
    if record[field] then
      break
    end
    record[field] = nil
  end
  return cmsgpack.pack(record)
end

-- history_open(state_key): the history's {size, number of its newest entry}, or false
-- when it is off or damaged (then nothing is recorded).
local function history_open(state_key)
  local state = redis.pcall('HMGET', state_key, 'size', 'seq')
  if state.err then
    return false
  end
  local size = tonumber(state[1] or HISTORY_DEFAULT_SIZE)
  local last = tonumber(state[2] or 0)
  if not size or not last or size <= 0 or size % 1 ~= 0 or last % 1 ~= 0 then
    return false
  end
  return {size, last}
end

-- record_history(opened, state_key, log_key, index_key, ids, records): add the entries
-- of ``records`` (those of the tasks ``ids``, in the order they ended) to the history
-- ``opened`` by history_open, and trim it to its size.
local function record_history(opened, state_key, log_key, index_key, ids, records)
  if not opened or #ids == 0 then
    return
  end
  local size, last = opened[1], opened[2]
  local previous = {}
  local damaged = false
  in_chunks(ids, function(first, final)
    local found = not damaged and redis.pcall('ZMSCORE', index_key, unpack(ids, first, final))
    if type(found) ~= 'table' or found.err then
      damaged = true
      return
    end
    for n = first, final do
      previous[n] = found[n - first + 1]
    end
  end)
  if damaged then
    return
  end
  local entries, members, newest = {}, {}, {}
  for n, id in ipairs(ids) do
    -- A score read back is the number as text; a number of this call (the same task
    -- twice) is written by Lua, whole numbers as integers.
    entries[n] = (newest[id] or previous[n] or '') .. '|' .. records[n]
    newest[id] = last + n
    members[2 * n - 1], members[2 * n] = last + n, id
  end
  -- The first write goes through pcall: a log of the wrong type, or a user whose ACL
  -- predates the history (docs/security.md), stops the history there.
  local total = last + #ids
  local length = false
  in_chunks(entries, function(first, final)
    if length ~= nil then
      -- LPUSH puts the last one given first: the newest entry heads the list.
      length = redis.pcall('LPUSH', log_key, unpack(entries, first, final))
      if type(length) ~= 'number' then
        length = nil -- nothing more is written
      end
    end
  end)
  if not length then
    return
  end
  redis.call('HSET', state_key, 'seq', total)
  in_chunks(members, function(first, final)
    redis.call('ZADD', index_key, unpack(members, first, final))
  end)
  if length >= size + HISTORY_TRIM_STEP then
    -- pcall: a user not granted the trim (docs/security.md) must not fail the step; the
    -- index it leaves is reported by the invariant checker.
    redis.pcall('ZREMRANGEBYSCORE', index_key, '-inf', total - size)
    redis.pcall('LTRIM', log_key, 0, size - 1)
  end
end
