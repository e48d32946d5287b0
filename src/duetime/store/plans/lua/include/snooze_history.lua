-- The history entry of a snooze, a run of them as one (state_key, log_key, index_key).
-- Keys as history.lua has them. Apart from history.lua because it rewrites an entry
-- (LSET), which only snooze_task does: the other scripts that record history need no
-- LSET.
-- @include history

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
