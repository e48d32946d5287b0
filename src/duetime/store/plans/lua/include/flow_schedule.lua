-- A schedule call's part: tasks due now filed in the call (the flow keys, wake, ready, holds).
-- A task made due now joins the due set in the call that makes it due, and a task that
-- may start is fed to ready. Keys as flow.lua has them, with leases_key, wake_key,
-- ready_key and holds_key.
-- @include probes
-- @include flow
-- @include flow_filing
-- @include flow_pick
-- @include flow_holds

-- Read every key file_now writes, before a script's first write (see probe_flow). Its
-- keys come as feed's, then holds_key.
local function probe_file_now(records_key, due_key, turns_key, throttled_key, tats_key,
                              running_key, leases_key, wake_key, ready_key, holds_key)
  probe_lists(ready_key, wake_key)
  probe_zsets(leases_key)
  probe_flow(records_key, due_key, turns_key, throttled_key, tats_key, running_key)
  probe_hashes(holds_key)
end

-- Tasks due now under flow control (``ids``, with their run-at in ``run_ats``; their flow
-- records already written) join the due set in the call that makes them due, as a plain
-- queue's join ready: a worker can start them (within their limits) with no dispatcher
-- pass. The script called probe_file_now first; its keys come as feed's, then holds_key.
local function file_now(config_key, records_key, due_key, turns_key, throttled_key, tats_key,
                        running_key, leases_key, wake_key, ready_key, holds_key, ids, run_ats,
                        now)
  file_due(records_key, due_key, turns_key, throttled_key, ids, run_ats)
  feed(config_key, records_key, due_key, turns_key, throttled_key, tats_key, running_key,
    leases_key, wake_key, ready_key, now)
  note_holds(holds_key, now)
end
