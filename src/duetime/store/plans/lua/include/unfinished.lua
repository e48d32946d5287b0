-- A leased attempt's task ended unfinished: cancelled or expired (keys given).
-- Keys as parameters: the worker's list, the task's records, flow control's as flow.lua
-- has them, and the history's.
-- @include probes
-- @include cancelling
-- @include flow_release
-- @include history

-- End one leased attempt's task unfinished: ``how`` is 'cancelled' or 'expired' (the
-- stats counter it is counted in; the history records it so). Out of the worker's list,
-- its lease and flow slot freed, its records forgotten, recorded in the history
-- (``duration`` and ``lateness`` in µs, false when the handler never ran; ``err`` the
-- error text the attempt ended with, or false). Every key it writes is read before its
-- first write (the worker's list is that write).
local function end_unfinished(cancelling_key, active_key, leases_key, tasks_key, attempts_key,
                              errors_key, early_key, stats_key, config_key, records_key,
                              due_key, turns_key, throttled_key, tats_key, running_key,
                              wake_key, ready_key, state_key, log_key, index_key, id, member,
                              worker, attempt, now, duration, lateness, err, how)
  local name = task_name_of(redis.call('HGET', tasks_key, id))
  probe_hashes(attempts_key, errors_key)
  probe_zsets(leases_key)
  local flowing = flow_to_release(config_key, records_key, due_key, turns_key, throttled_key,
    tats_key, running_key, ready_key)
  if flowing then
    probe_lists(wake_key)
  end
  redis.call('LREM', active_key, 1, id)
  redis.call('ZREM', leases_key, member)
  if flowing then
    release_and_feed(config_key, records_key, due_key, turns_key, throttled_key, tats_key,
      running_key, leases_key, wake_key, ready_key, {id}, {member}, true, now)
  end
  forget_cancelled(cancelling_key, tasks_key, attempts_key, errors_key, early_key, stats_key,
    {id}, how)
  local outcome = how == 'expired' and HISTORY_EXPIRED or HISTORY_CANCELLED
  record_history(history_open(state_key), state_key, log_key, index_key, {id},
    {history_record(id, name, outcome, tonumber(attempt), now, worker,
      duration and math.max(0, duration), lateness and math.max(0, lateness), err)})
end
