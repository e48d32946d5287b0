-- The snooze count a task's envelope carries (codec.py, version 4: [4, task, snoozes,
-- data, run-at, limits...]), read and rewritten from the envelope's first bytes: the
-- user data after it is never decoded. An envelope of version 1 to 3 has no count (0);
-- counting its first snooze makes it version 4 (one more array element, the count after
-- the task name), as codec.with_snoozes does. And record_snooze, the history entry of a
-- snooze, which coalesces a run of them (it uses history.lua, included before this).

-- envelope_snoozes(envelope): {snoozes, the head before the count, the rest after it},
-- or false for anything that does not start as duetime writes an envelope.
local function envelope_snoozes(envelope)
  if type(envelope) ~= 'string' then
    return false
  end
  local array, version, kind = string.byte(envelope, 1, 3)
  if not kind or array < 0x94 or array > 0x9e or version < 1 or version > 4 then
    return false
  end
  local after -- the position after the task name
  if kind >= 0xa0 and kind <= 0xbf then
    after = 4 + kind - 0xa0
  elseif kind == 0xd9 and #envelope >= 4 then
    after = 5 + string.byte(envelope, 4)
  elseif kind == 0xda and #envelope >= 5 then
    after = 6 + string.byte(envelope, 4) * 256 + string.byte(envelope, 5)
  else
    return false
  end
  if version < 4 then
    return {0, string.sub(envelope, 1, after - 1), string.sub(envelope, after)}
  end
  local count, first = string.byte(envelope, after), 0
  local width = 1
  if not count then
    return false
  elseif count <= 0x7f then
    first = count
  elseif count >= 0xcc and count <= 0xce then
    width = ({[0xcc] = 2, [0xcd] = 3, [0xce] = 5})[count]
    for n = 1, width - 1 do
      local byte = string.byte(envelope, after + n)
      if not byte then
        return false
      end
      first = first * 256 + byte
    end
  else
    return false
  end
  return {first, string.sub(envelope, 1, after - 1), string.sub(envelope, after + width)}
end

-- snoozed_envelope(envelope): the envelope with one snooze more (false when it is not
-- an envelope duetime wrote: it is then left as it is).
local function snoozed_envelope(envelope)
  local found = envelope_snoozes(envelope)
  if not found then
    return false
  end
  local head = found[2]
  if found[1] == 0 then -- one element more, and version 4
    head = string.char(string.byte(head, 1) + 1, 4) .. string.sub(head, 3)
  end
  return head .. cmsgpack.pack(found[1] + 1) .. found[3]
end

-- record_snooze(opened, state_key, log_key, index_key, id, record, now): record the snooze
-- ``record`` (history_record) of task ``id``. When the task's newest entry in the history
-- is a snooze too (it snoozed again, and nothing else of it ended meanwhile), that entry
-- counts one more and notes ``now`` as the latest, in its place: a task that snoozes again
-- and again takes one entry, and pushes no other ending out of the history. Otherwise
-- (or when the entry cannot be rewritten: LSET refused by an older ACL) a new entry.
local function record_snooze(opened, state_key, log_key, index_key, id, record, now)
  if not opened then
    return
  end
  local size, last = opened[1], opened[2]
  local number = tonumber(redis.pcall('ZSCORE', index_key, id))
  if number and last - number >= 0 and last - number < size then
    local index = last - number
    local found = redis.pcall('LRANGE', log_key, index, index)
    local entry = type(found) == 'table' and found[1]
    local bar = type(entry) == 'string' and string.find(entry, '|', 1, true)
    local read, fields = false, nil
    if bar then
      read, fields = pcall(cmsgpack.unpack, string.sub(entry, bar + 1))
    end
    if read and type(fields) == 'table' and fields[1] == id and fields[3] == HISTORY_SNOOZED then
      for field = 1, 9 do
        if fields[field] == nil then
          fields[field] = false -- an array, not a map: no holes
        end
      end
      fields[10] = (tonumber(fields[10]) or 1) + 1
      fields[11] = now
      local written = redis.pcall('LSET', log_key, index,
        string.sub(entry, 1, bar) .. cmsgpack.pack(fields))
      if type(written) ~= 'table' or not written.err then
        return
      end
    end
  end
  record_history(opened, state_key, log_key, index_key, {id}, {record})
end
