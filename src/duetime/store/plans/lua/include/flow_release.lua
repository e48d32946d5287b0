-- A lease's end under flow control: its slot, its key's turn, the feed (the flow keys).
-- The slot in running_key is given back, the key gets its turn (turns_key) if it has due
-- tasks, and a task that may start is fed to ready_key. Keys as flow.lua has them.
-- @include probes
-- @include chunks
-- @include flow
-- @include flow_records
-- @include flow_turns
-- @include flow_pick

-- Free the slots of tasks whose lease ended: ``ids``, and ``leases`` their lease members
-- ("<worker>|<id>"); each group that has due tasks gets its turn back. ``forget``: the
-- tasks are gone (their records too).
local function release(records_key, running_key, due_key, turns_key, throttled_key, ids,
                       leases, forget)
  local gone, groups = {}, {}
  in_chunks(ids, function(first, last)
    local stored = redis.call('HMGET', records_key, unpack(ids, first, last))
    for n = first, last do
      local _, _, _, group = parse_record(stored[n - first + 1])
      gone[#gone + 1] = group .. '\0' .. leases[n]
      groups[group] = true
    end
    if forget then
      redis.call('HDEL', records_key, unpack(ids, first, last))
    end
  end)
  in_chunks(gone, function(first, last)
    redis.call('ZREM', running_key, unpack(gone, first, last))
  end)
  local listed = {}
  for group in pairs(groups) do
    listed[#listed + 1] = group
  end
  give_turns(turns_key, throttled_key, listed, function(group)
    return first_of(due_key, group) -- a group with due tasks
  end)
end

-- Whether the queue is under flow control; if it is, every key a release writes is read
-- first (the flow keys, and ``list_key``: the ready or wake list it may push to), so
-- that one of the wrong type fails the call with nothing written.
local function flow_to_release(config_key, records_key, due_key, turns_key, throttled_key,
                               tats_key, running_key, list_key)
  if not flow_on(config_key) then
    return false
  end
  probe_lists(list_key)
  probe_flow(records_key, due_key, turns_key, throttled_key, tats_key, running_key)
  return true
end

-- After the leases of tasks ended (``ids``, with their lease members ``leases``): free
-- their slots (release), and keep a task that may start in ready for a blocked worker
-- (feed).
local function release_and_feed(config_key, records_key, due_key, turns_key, throttled_key,
                                tats_key, running_key, leases_key, wake_key, ready_key,
                                ids, leases, forget, now)
  release(records_key, running_key, due_key, turns_key, throttled_key, ids, leases, forget)
  feed(config_key, records_key, due_key, turns_key, throttled_key, tats_key, running_key,
    leases_key, wake_key, ready_key, now)
end
