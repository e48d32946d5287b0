-- A call's limits (config_key) and the slots counted against them (running_key, leases_key).
-- The limits are read once per call; a slot whose lease is gone is healed. Keys as
-- flow.lua has them.
-- @include chunks

-- Lease members of the tasks this call started: their leases are written at its end.
local started_here = {}

-- At least as many as run in the queue as a call goes (read once, counted up at each
-- start; entries left by gone leases only make it larger): no key runs more, so a key
-- whose limit leaves room for its candidates under it needs no count of its own.
local running_bound = false

-- Drop from running the entries in [low, high] (BYLEX) whose lease is gone: a task taken
-- back by a path that did not release its slot never holds it. Returns how many stay.
local function heal_running(running_key, leases_key, low, high)
  local members = redis.call('ZRANGE', running_key, low, high, 'BYLEX')
  local gone = {}
  in_chunks(members, function(first, last)
    local leases = {}
    for n = first, last do
      local member = members[n]
      leases[#leases + 1] = string.sub(member, string.find(member, '\0', 1, true) + 1)
    end
    local deadlines = redis.call('ZMSCORE', leases_key, unpack(leases))
    for n = first, last do
      if not deadlines[n - first + 1] and not started_here[leases[n - first + 1]] then
        gone[#gone + 1] = members[n]
      end
    end
  end)
  in_chunks(gone, function(first, last)
    redis.call('ZREM', running_key, unpack(gone, first, last))
  end)
  return #members - #gone
end

-- The limits of a script call, read once per group: {cap, queue rate} and per group
-- {concurrency, rate}. A group's own value wins over the queue's for each key ("none"
-- lifts it); tasks without a limit key answer only to the queue's limits.
local read_limits, queue_limits = {}, false

-- Read the limits of ``groups`` not read yet in this call, in one command.
local function read_limits_of(config_key, groups)
  local fields, wanted = {'cap', 'rate', 'each_concurrency', 'each_rate'}, {}
  for _, group in ipairs(groups) do
    if not read_limits[group] and not wanted[group] then
      wanted[group] = #fields + 1
      fields[#fields + 1] = 'concurrency:' .. group
      fields[#fields + 1] = 'rate:' .. group
    end
  end
  if queue_limits and #fields == 4 then
    return
  end
  local got = redis.call('HMGET', config_key, unpack(fields))
  queue_limits = {tonumber(got[1]) or false, got[2] or false}
  for group, at in pairs(wanted) do
    if group == '' then
      read_limits[group] = {false, false}
    else
      read_limits[group] = {tonumber(got[at] or got[3]) or false, got[at + 1] or got[4] or false}
    end
  end
end

local function limits_of(config_key, group)
  read_limits_of(config_key, {group})
  return read_limits[group]
end
