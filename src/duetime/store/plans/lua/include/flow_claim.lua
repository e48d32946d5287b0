-- The claim's check of a task as it starts: its hold, its key's turn, its start counted.
-- For an id claim_tasks takes from ready (keys as flow.lua has them).
-- @include flow
-- @include flow_turns
-- @include flow_limits
-- @include flow_rates

-- Why the next task of ``group`` (of ``cost``) may not start now: false when it may, then
-- with the arrival times its start leaves (group's, queue's). Else 'cap' (the queue runs
-- all it may) or 'queue' (its rate limit, with when it may start), which hold every
-- group; 'busy' (the group runs all it may) or 'rate' (with when it may start).
local function hold_of(config_key, running_key, leases_key, tats_key, throttled_key, group,
                       cost, now)
  local limits = limits_of(config_key, group)
  local cap = queue_limits[1]
  if cap and redis.call('ZCARD', running_key) >= cap
      and heal_running(running_key, leases_key, '-', '+') >= cap then
    return 'cap'
  end
  local most = limits[1]
  if most and not running_bound then
    running_bound = redis.call('ZCARD', running_key)
  end
  if most and running_bound >= most
      and redis.call('ZLEXCOUNT', running_key, group_low(group), group_high(group)) >= most
      and heal_running(running_key, leases_key, group_low(group), group_high(group)) >= most then
    return 'busy'
  end
  local waits = tonumber(redis.call('ZSCORE', throttled_key, group))
  if waits and waits > now then -- snoozed by a handler, or a rate's wait not yet over
    return 'rate', waits
  end
  local group_at, group_tat = rate_check(tats_key, group, limits[2], cost, now)
  if group_at > now then
    return 'rate', group_at
  end
  local queue_at, queue_tat = rate_check(tats_key, QUEUE_GROUP, queue_limits[2], cost, now)
  if queue_at > now then
    return 'queue', queue_at
  end
  return false, group_tat, queue_tat
end

-- What a hold does to the turns: a busy group leaves them until one of its tasks ends
-- (release), a throttled one until its rate allows (the dispatcher gives it back). A
-- hold of the whole queue keeps the group's turn.
local function hold_group(turns_key, throttled_key, wake_key, group, hold, at)
  if hold == 'busy' or hold == 'rate' then
    redis.call('ZREM', turns_key, group)
    if hold == 'rate' then
      throttle(throttled_key, wake_key, group, at)
    end
  elseif hold == 'queue' then
    throttle(throttled_key, wake_key, QUEUE_GROUP, at)
  end
end

-- Count a start: the task holds a slot of its group (and of the queue) while its lease
-- lasts, and spends its cost of the rates.
local function start_task(running_key, tats_key, group, lease, group_tat, queue_tat)
  started_here[lease] = true
  running_bound = running_bound and running_bound + 1
  redis.call('ZADD', running_key, 0, group .. '\0' .. lease)
  if group_tat then
    redis.call('ZADD', tats_key, group_tat, group)
  end
  if queue_tat then
    redis.call('ZADD', tats_key, queue_tat, QUEUE_GROUP)
  end
end
