-- The dispatcher's part: due tasks filed by key, rank and turn (records, due, turns keys).
-- Also a schedule call's (flow_schedule.lua) and a claim's, which put a task back among
-- the due. Keys as flow.lua has them.
-- @include chunks
-- @include flow_records
-- @include flow_turns

-- Put due tasks in the due set, ranked: ``ids`` with their run-at (ms) in ``run_ats``.
local function file_due(records_key, due_key, turns_key, throttled_key, ids, run_ats)
  local members, records, groups = {}, {}, {}
  in_chunks(ids, function(first, last)
    local stored = redis.call('HMGET', records_key, unpack(ids, first, last))
    for n = first, last do
      local id = ids[n]
      local priority, cost, _, group = parse_record(stored[n - first + 1])
      local rank = rank_of(run_ats[n], priority)
      members[#members + 1] = 0
      members[#members + 1] = group .. '\0' .. rank .. '\0' .. id
      records[#records + 1] = id
      records[#records + 1] = record_of(priority, cost, rank, group)
      groups[group] = true
    end
  end)
  in_chunks(members, function(first, last)
    redis.call('ZADD', due_key, unpack(members, first, last))
  end)
  in_chunks(records, function(first, last)
    redis.call('HSET', records_key, unpack(records, first, last))
  end)
  local listed = {}
  for group in pairs(groups) do
    listed[#listed + 1] = group
  end
  give_turns(turns_key, throttled_key, listed)
end

-- Put back among the due a task taken from ready that may not start yet; its group.
local function refile(records_key, due_key, id, now)
  local priority, cost, rank, group = parse_record(redis.call('HGET', records_key, id))
  if rank == '' then
    rank = rank_of(now, priority)
    redis.call('HSET', records_key, id, record_of(priority, cost, rank, group))
  end
  redis.call('ZADD', due_key, 0, group .. '\0' .. rank .. '\0' .. id)
  return group
end

-- Put tasks taken back from a worker (a lease that ran out, a reaped worker) among the
-- due at once, each at the rank it had: a task that started once keeps its place, as one
-- handed back does, rather than queueing behind its key's whole backlog. Their groups get
-- their turn from release(), which frees their slots.
local function reenter_due(records_key, due_key, ids, now)
  for _, id in ipairs(ids) do
    refile(records_key, due_key, id, now)
  end
end
