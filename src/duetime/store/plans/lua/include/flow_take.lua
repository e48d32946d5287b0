-- One key's turn in a pick: which of its due tasks may start, and a round's writes.
-- As many of its best-ranked due tasks as may start now are taken; a round's writes go
-- to due_key, running_key and tats_key. Keys as flow.lua has them.
-- @include chunks
-- @include flow
-- @include flow_records
-- @include flow_limits
-- @include flow_rates
-- @include flow_holds

-- Take the next due tasks of one group, best rank first, as many of ``candidates`` (its
-- due members, in order) as may start now; ``room`` holds what this call may still
-- start ({cap room or false}); the queue's rate state is ``queue`` ({tat, changed}).
-- What it takes goes in ``writes`` (write_round writes a round's at once); each start
-- notes in held_until the time its rate (or the queue's) allowed it. Returns how
-- many it took, and why it stopped short: false, 'cap' or 'queue' (which hold every
-- group), 'busy' or 'rate' (with the time it may start).
local function take_group(config_key, records_key, running_key, leases_key, tats_key,
                          group, candidates, room, queue, now, worker, writes)
  local limits = limits_of(config_key, group)
  local key_room = false
  if limits[1] and not running_bound then -- the round's starts are not written yet
    running_bound = redis.call('ZCARD', running_key) + #writes.running / 2
  end
  if limits[1] and limits[1] - running_bound >= #candidates then
    key_room = limits[1] - running_bound
  elseif limits[1] then
    local low, high = group_low(group), group_high(group)
    key_room = limits[1] - redis.call('ZLEXCOUNT', running_key, low, high)
    if key_room <= 0 then
      key_room = limits[1] - heal_running(running_key, leases_key, low, high)
    end
  end
  local interval, burst = rate_parts(limits[2])
  local queue_interval, queue_burst = rate_parts(queue_limits[2])
  local ids, costs = {}, {}
  for n, member in ipairs(candidates) do
    ids[n] = due_id(member)
  end
  if interval or queue_interval then -- costs count only against a rate
    local records = redis.call('HMGET', records_key, unpack(ids))
    for n = 1, #ids do
      local _, cost = parse_record(records[n])
      costs[n] = cost
    end
  end
  local tat = interval and tonumber(redis.call('ZSCORE', tats_key, group))
  local taken, running, why, at = {}, {}, false, nil
  for n, id in ipairs(ids) do
    if room[1] and room[1] <= 0 then
      why = 'cap'
      break
    end
    if key_room and key_room <= 0 then
      why = 'busy'
      break
    end
    local cost = costs[n] or 1
    local next_tat, next_queue_tat
    local allowed = false
    if interval then
      at, next_tat = gcra(tat, interval, burst, cost, now)
      if at > now then
        why = 'rate'
        break
      end
      allowed = later(allowed, at)
    end
    if queue_interval then
      at, next_queue_tat = gcra(queue[1], queue_interval, queue_burst, cost, now)
      if at > now then
        why = 'queue'
        break
      end
      allowed = later(allowed, at)
      queue[1], queue[2] = next_queue_tat, true
    end
    tat = next_tat or tat
    taken[#taken + 1] = candidates[n]
    if worker then
      held_until[id], started_group[id] = allowed, group
      running[#running + 1] = 0
      running[#running + 1] = group .. '\0' .. worker .. '|' .. id
      started_here[worker .. '|' .. id] = true
      running_bound = running_bound and running_bound + 1
      room[1] = room[1] and room[1] - 1
    end
    key_room = key_room and key_room - 1
  end
  for n = 1, #taken do
    writes.due[#writes.due + 1] = taken[n]
    writes.ids[#writes.ids + 1] = ids[n]
  end
  for _, entry in ipairs(running) do
    writes.running[#writes.running + 1] = entry
  end
  if interval and #taken > 0 and worker then
    writes.tats[#writes.tats + 1] = tat
    writes.tats[#writes.tats + 1] = group
  end
  return #taken, why, at
end

-- Write what a round of take_group took: out of the due set, into running, the rates
-- spent; one command each.
local function write_round(due_key, running_key, tats_key, writes)
  in_chunks(writes.due, function(first, last)
    redis.call('ZREM', due_key, unpack(writes.due, first, last))
  end)
  in_chunks(writes.running, function(first, last)
    redis.call('ZADD', running_key, unpack(writes.running, first, last))
  end)
  in_chunks(writes.tats, function(first, last)
    redis.call('ZADD', tats_key, unpack(writes.tats, first, last))
  end)
end
