-- The snooze count in a task's envelope, read and rewritten in place. No keys.
-- The count is codec.py's (version 4: [4, task, snoozes, data, run-at, limits...]), read
-- and rewritten from the envelope's first bytes: the user data after it is never decoded.
-- An envelope of version 1 to 3 has no count (0); counting its first snooze makes it
-- version 4 (one more array element, the count after the task name), as
-- codec.with_snoozes does.

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

-- unsnoozed_envelope(envelope): the envelope with no snooze counted (version 4 back to
-- the version 2 or 3 it was: 8 elements are a version 3), or false when it counts none
-- or is not an envelope duetime wrote.
local function unsnoozed_envelope(envelope)
  local found = envelope_snoozes(envelope)
  if not found or found[1] == 0 then
    return false
  end
  local head = found[2]
  local array = string.byte(head, 1) - 1
  head = string.char(array, array == 0x98 and 3 or 2) .. string.sub(head, 3)
  return head .. found[3]
end
