-- A task's flow record (records_key) and its member of the due set (due_key).
-- A record: "<priority>|<cost>|<rank>|<group>", rank empty until the task is due; a
-- member of the due set: "<group>\0<rank>\0<task id>" (see flow.lua).
local MOST_RANK = 999999999999999

-- A task's priority, cost, rank (text, '' until due) and group, from its record (false,
-- or garbage written by hand: the defaults, as for a task scheduled without any).
local function parse_record(record)
  if record then
    local priority, cost, rank, group = string.match(record, '^(%-?%d+)|(%d+)|(%d*)|(.*)$')
    if priority then
      return tonumber(priority), math.max(1, tonumber(cost)), rank, group
    end
  end
  return 0, 1, '', ''
end

local function record_of(priority, cost, rank, group)
  return priority .. '|' .. cost .. '|' .. rank .. '|' .. group
end

-- Where a task due at ``run_at`` (ms) with ``priority`` ranks: as if due that many
-- seconds earlier. A priority never moves a run-at: it orders only tasks already due.
local function rank_of(run_at, priority)
  local rank = math.min(MOST_RANK, math.max(0, math.floor(run_at - 1000 * priority)))
  return string.format('%015d', rank)
end

-- The member of task ``id`` in the due set, or false when it is not there.
local function due_member_of(records_key, due_key, id)
  local _, _, rank, group = parse_record(redis.call('HGET', records_key, id))
  local member = group .. '\0' .. rank .. '\0' .. id
  if rank ~= '' and redis.call('ZSCORE', due_key, member) then
    return member
  end
  return false
end
