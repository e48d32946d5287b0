-- The pick from the due set by turns, and the feed of ready: the flow keys, wake, ready.
-- A claim picks tasks to start; the feed picks one for ready, to wake a blocked worker.
-- Keys as flow.lua has them, with leases_key, wake_key and ready_key.
-- @include flow
-- @include flow_turns
-- @include flow_limits
-- @include flow_holds
-- @include flow_take

-- Groups looked at per pick before giving up for this call (each one refused leaves the
-- turns, so the next call starts past it): bounds how long one call holds the server.
local PICK_TRIES = 64

-- The running count of the queue (cap) as a call goes: read once, healed at the cap.
local queue_running = false

-- Take up to ``need`` due tasks that may start now, key by key in turns (round-robin; a
-- key alone in the turns gives all it may), the best-ranked of each key first: their
-- ids. ``worker``: start them for that worker (each holds a slot, "<group>\0<worker>|<id>",
-- and spends its cost of the rates); false: only take them out of the due set (to hand
-- to ready: they are checked again when claimed). A key refused leaves the turns (until
-- a slot frees, or at its rate's time); a refusal of the whole queue (its cap or rate)
-- ends the call. Also returns 'tries' when too many keys were refused in this call.
-- What it finds of each key is kept for note_holds.
local function pick_many(config_key, records_key, due_key, turns_key, throttled_key, tats_key,
                         running_key, leases_key, wake_key, now, worker, need)
  local picked, tries = {}, 0
  limits_of(config_key, '')  -- reads the queue's own limits (queue_limits)
  local room = {false}
  if queue_limits[1] then -- a hint for ready too: none while the queue runs all it may
    if not queue_running then
      queue_running = redis.call('ZCARD', running_key)
      if queue_running >= queue_limits[1] then
        queue_running = heal_running(running_key, leases_key, '-', '+')
      end
    end
    room[1] = queue_limits[1] - queue_running
  end
  local queue = {tonumber(redis.call('ZSCORE', tats_key, QUEUE_GROUP)), false}
  local stop = false
  while #picked < need and not stop do
    local round = redis.call('ZRANGE', turns_key, 0, need - #picked - 1, 'WITHSCORES')
    if #round == 0 then
      break
    end
    local share = #round == 2 and (need - #picked) or 1 -- a lone key gives all it may
    local last = tonumber(redis.call('ZRANGE', turns_key, -1, -1, 'WITHSCORES')[2])
    local done, again, groups = {}, {}, {}
    for i = 1, #round, 2 do
      groups[#groups + 1] = round[i]
    end
    read_limits_of(config_key, groups)
    local writes = {due = {}, ids = {}, running = {}, tats = {}}
    for i = 1, #round, 2 do
      local group = round[i]
      tries = tries + 1
      local candidates = redis.call('ZRANGE', due_key, group_low(group), group_high(group),
        'BYLEX', 'LIMIT', 0, share + 1)
      local more = #candidates > share
      if more then
        candidates[#candidates] = nil
      end
      local took, why, at = 0, false, nil
      if #candidates > 0 then
        took, why, at = take_group(config_key, records_key, running_key, leases_key, tats_key,
          group, candidates, room, queue, now, worker, writes)
      end
      local started = worker and took > 0
      looked[group] = {why, started or (looked[group] or {})[2], not more and took == #candidates}
      queue_look.capped = queue_look.capped or why == 'cap'
      if started then
        queue_look.started, queue_look.room = true, room[1]
      end
      if why == 'cap' or why == 'queue' then
        if why == 'queue' then
          throttle(throttled_key, wake_key, QUEUE_GROUP, at)
        end
        stop = true -- the group keeps its place: nothing of it was refused
        break
      end
      done[#done + 1] = group
      if why == 'rate' then
        throttle(throttled_key, wake_key, group, at)
      elseif not why and (more or took < #candidates) then
        last = last + 1
        again[#again + 1] = last
        again[#again + 1] = group
      end
      if tries >= PICK_TRIES and #picked + #writes.ids < need then
        stop = true
        break
      end
    end
    write_round(due_key, running_key, tats_key, writes)
    for _, id in ipairs(writes.ids) do
      picked[#picked + 1] = id
    end
    if #done > 0 then
      redis.call('ZREM', turns_key, unpack(done))
    end
    if #again > 0 then
      redis.call('ZADD', turns_key, unpack(again))
    end
  end
  if queue[2] and worker then
    redis.call('ZADD', tats_key, queue[1], QUEUE_GROUP)
  end
  if room[1] and worker then
    queue_running = queue_limits[1] - room[1]
  end
  return picked, (tries >= PICK_TRIES and #picked < need) and 'tries' or false
end

-- Keep one due task in ready while any may start, so that a worker blocked on ready
-- wakes for it (its claim checks it again, and takes more by turns). A call that gave
-- up after too many refused groups wakes a dispatcher to go on.
local function feed(config_key, records_key, due_key, turns_key, throttled_key, tats_key,
                    running_key, leases_key, wake_key, ready_key, now)
  if redis.call('LLEN', ready_key) > 0 then
    return
  end
  local ids, why = pick_many(config_key, records_key, due_key, turns_key, throttled_key,
    tats_key, running_key, leases_key, wake_key, now, false, 1)
  if #ids > 0 then
    redis.call('RPUSH', ready_key, ids[1])
  elseif why == 'tries' and redis.call('LLEN', wake_key) == 0 then
    redis.call('RPUSH', wake_key, 1)
  end
end
