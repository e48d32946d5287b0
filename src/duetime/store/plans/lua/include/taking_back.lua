-- What the take-back scripts share: a worker's list, its cancels ended (keys given).
-- The scripts are reap_worker, release_worker and reap_expired_leases. Keys as
-- parameters: the worker's list, the task's records, the cancelling hash
-- (cancelling.lua), flow control's as flow.lua has them.
-- @include probes
-- @include hash_values
-- @include cancelling
-- @include flow_release

-- The ids in a worker's list (``active_key``), their envelopes (in ``tasks_key``: false
-- for an id that is no task, written by hand or by another program), and the ids of
-- those that are tasks, in the list's order.
local function listed_tasks(active_key, tasks_key)
  local listed = redis.call('LRANGE', active_key, 0, -1)
  local envelopes = hash_values(tasks_key, listed)
  local known = {}
  for n, id in ipairs(listed) do
    if envelopes[n] then
      known[#known + 1] = id
    end
  end
  return listed, envelopes, known
end

-- Which of the tasks ``ids`` end as cancelled (their cancel was asked): the set of them
-- (cancels_asked), and their ids in order. When there are some, the hashes given as
-- ``...`` (the records their end writes) are read first (probe_hashes).
local function cancels_among(cancelling_key, ids, ...)
  local asked = cancels_asked(cancelling_key, ids)
  local cancelled = split_cancelled(ids, asked, true)
  if #cancelled > 0 then
    probe_hashes(...)
  end
  return asked, cancelled
end

-- End the tasks taken back whose cancel was asked (``ids``, with their lease members
-- ``leases``): under flow control (``flowing``) their slots are freed and their records
-- go; then their records and marks are forgotten, and they are counted as cancelled.
local function end_taken_cancelled(flowing, records_key, running_key, due_key, turns_key,
                                   throttled_key, cancelling_key, tasks_key, attempts_key,
                                   errors_key, early_key, stats_key, ids, leases)
  if flowing and #ids > 0 then
    release(records_key, running_key, due_key, turns_key, throttled_key, ids, leases, true)
  end
  forget_cancelled(cancelling_key, tasks_key, attempts_key, errors_key, early_key, stats_key,
    ids)
end
