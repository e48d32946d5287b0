-- The history: a capped record of finished attempts, written by the script that ends
-- each one (needs chunks.lua). Three keys, given as parameters:
--   state_key  HASH  "size": how many entries to keep (absent: HISTORY_DEFAULT_SIZE;
--                    0: off), "seq": the number of the newest entry
--   log_key    LIST  the entries, newest first: entry number seq is at index
--                    (state.seq - seq), for as long as it is kept
--   index_key  ZSET  task id -> the number of its newest entry; each entry names the
--                    one before it of the same task, so a task's entries are found
--                    without a scan
-- An entry is a msgpack array, trailing false elements left out: task id, task name
-- (false: the envelope could not be read), outcome (the HISTORY_* codes), attempt,
-- finished at (ms), worker, duration (µs), lateness (µs), previous entry of the task,
-- error text.
-- The history never fails the step that ends an attempt: its keys are read, and first
-- written, with pcall; one that is damaged (a wrong type, a size or number that is not
-- one), a history that is off, or a user not granted its commands leaves it as it is.
local HISTORY_DEFAULT_SIZE = 1000
local HISTORY_SUCCEEDED, HISTORY_RETRIED, HISTORY_DEAD = 1, 2, 3
local HISTORY_SNOOZED, HISTORY_LOST, HISTORY_CANCELLED = 4, 5, 6

-- The task name at the head of an envelope (msgpack [version, name, ...]), read from its
-- first bytes rather than decoded: the data after it may be large. False for anything
-- that does not start as duetime writes an envelope.
local function task_name_of(envelope)
  if type(envelope) ~= 'string' then
    return false
  end
  local array, version, kind = string.byte(envelope, 1, 3)
  if not kind or array < 0x94 or array > 0x9f or (version ~= 1 and version ~= 2) then
    return false
  end
  if kind >= 0xa0 and kind <= 0xbf then
    return string.sub(envelope, 4, 3 + kind - 0xa0)
  elseif kind == 0xd9 and #envelope >= 4 then
    return string.sub(envelope, 5, 4 + string.byte(envelope, 4))
  end
  return false
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

-- record_history(opened, state_key, log_key, index_key, now, entries): add ``entries``
-- (each {task id, task name or false, outcome, attempt, worker or false, duration µs or
-- false, lateness µs or false, error text or false}), finished at ``now`` (ms), to the
-- history ``opened`` by history_open, and trim it to its size.
local function record_history(opened, state_key, log_key, index_key, now, entries)
  if not opened or #entries == 0 then
    return
  end
  local size, last = opened[1], opened[2]
  local ids = {}
  for n, entry in ipairs(entries) do
    ids[n] = entry[1]
  end
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
  local blobs, members, newest = {}, {}, {}
  for n, entry in ipairs(entries) do
    local seq = last + n
    local id = entry[1]
    local record = {id, entry[2] or false, entry[3], entry[4], now, entry[5] or false,
      entry[6] or false, entry[7] or false, newest[id] or tonumber(previous[n]) or false,
      entry[8] or false}
    for field = 10, 1, -1 do
      if record[field] then
        break
      end
      record[field] = nil
    end
    newest[id] = seq
    -- LPUSH puts the last one given first: the newest entry heads the list.
    blobs[n] = cmsgpack.pack(record)
    members[2 * n - 1], members[2 * n] = seq, id
  end
  -- The first two writes go through pcall: a log of the wrong type, or a user whose ACL
  -- predates the history (docs/security.md), stops the history there, and all that was
  -- written is the index entries of entries about to be trimmed anyway.
  local total = last + #entries
  if type(redis.pcall('ZREMRANGEBYSCORE', index_key, '-inf', total - size)) ~= 'number' then
    return
  end
  local length = false
  in_chunks(blobs, function(first, final)
    if length ~= nil then
      length = redis.pcall('LPUSH', log_key, unpack(blobs, first, final))
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
  if length > size then
    redis.call('LTRIM', log_key, 0, size - 1)
  end
end
