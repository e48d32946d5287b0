-- Flow control, given its keys as parameters: priorities, turns between limit keys, rate
-- limits and concurrency limits. Every limit is checked as a task starts (claim_tasks,
-- with the lease it takes), never before, so none is passed. Needs chunks.lua and
-- flow_records.lua.
--
-- A queue is under flow control while its limits hash (config_key) exists: scheduling a
-- task with a priority or a limit key creates it, declaring a limit too. Its due tasks
-- then wait in the due set rather than in ready, in one group per limit key (tasks
-- without one are the group ""), and a claim takes them group by group in turns.
--   config_key    HASH  cap, rate, each_concurrency, each_rate, concurrency:<group>,
--                       rate:<group> (a rate is "<count>|<period ms>|<burst>"), since
--   records_key   HASH  task id -> "<priority>|<cost>|<rank>|<group>" (rank: empty until
--                       the task is due)
--   due_key       ZSET  all scores 0: "<group>\0<rank>\0<task id>", so one range BYLEX
--                       reads a group's best-ranked task. rank: run-at (ms) less 1000 ms
--                       per point of priority, 15 digits
--   turns_key     ZSET  group -> its turn: the groups whose due tasks may be looked at
--   throttled_key ZSET  group -> when its rate limit lets its next task start (ms); the
--                       member "\0" is the queue's own rate limit
--   tats_key      ZSET  group (or "\0") -> its theoretical arrival time (GCRA, ms)
--   running_key   ZSET  all scores 0: "<group>\0<worker>|<task id>" per started task
--   holds_key     HASH  group (or "\0") -> when its latest hold by a limit ended (ms), or
--                       'slot' (see note_holds)
-- A limit key holds no control character, so "\0" and "\1" bound a group's range.
local QUEUE_GROUP = '\0'
-- Groups looked at per pick before giving up for this call (each one refused leaves the
-- turns, so the next call starts past it): bounds how long one call holds the server.
local PICK_TRIES = 64

local function flow_on(config_key)
  return redis.call('EXISTS', config_key) == 1
end

local function group_low(group)
  return '[' .. group .. '\0'
end

local function group_high(group)
  return '(' .. group .. '\1'
end

-- The task id in a member of the due set ("<group>\0<rank>\0<id>": the rank has no "\0").
local function due_id(member)
  local first = string.find(member, '\0', 1, true)
  return string.sub(member, string.find(member, '\0', first + 1, true) + 1)
end

-- The group's first member of a set ordered BYLEX (due or running), or false.
local function first_of(set_key, group)
  return redis.call('ZRANGE', set_key, group_low(group), group_high(group), 'BYLEX', 'LIMIT',
    0, 1)[1] or false
end

-- Give each of ``groups`` a turn after every group that has one, unless it has one or
-- waits for its rate limit: give_turn for many, in a few commands whatever their number.
-- With ``wanted`` (a function of a group), only to those it accepts: it is asked only of
-- the groups without a turn (most keep theirs).
local function give_turns(turns_key, throttled_key, groups, wanted)
  local adds = {}
  local last = false
  in_chunks(groups, function(first, final)
    local having = redis.call('ZMSCORE', turns_key, unpack(groups, first, final))
    local waiting = redis.call('ZMSCORE', throttled_key, unpack(groups, first, final))
    last = last or tonumber(redis.call('ZRANGE', turns_key, -1, -1, 'WITHSCORES')[2]) or 0
    for n = first, final do
      if not having[n - first + 1] and not waiting[n - first + 1]
          and (not wanted or wanted(groups[n])) then
        last = last + 1
        adds[#adds + 1] = last
        adds[#adds + 1] = groups[n]
      end
    end
  end)
  in_chunks(adds, function(first, final)
    redis.call('ZADD', turns_key, unpack(adds, first, final))
  end)
end

-- give_turns for one group.
local function give_turn(turns_key, throttled_key, group)
  give_turns(turns_key, throttled_key, {group})
end

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

-- Lease members of the tasks this call started: their leases are written at its end.
local started_here = {}

-- Until when limits held each task this call started (task id -> ms; none: not held),
-- for its lateness to count from then rather than from when it was due (metrics.md):
-- the time its rate (or the queue's) allowed it, or what holds_key says (note_holds).
local held_until = {}
-- The group of each task this call started, and what pick_many found of each group it
-- looked at ({why it stopped, whether it started any, whether none is left due}) and of
-- the queue: what note_holds reads.
local started_group, looked, queue_look = {}, {}, {}

-- The holds noted in holds_key, per group ("\0" the queue): when its latest hold ended,
-- for a rate's wait or a snooze of the whole key (noted by the dispatcher as it gives
-- the turn back: the wait's end, not its own pass); or SLOT while the group (the queue,
-- at its cap) runs all it may with tasks due: its next start waited for a slot, until
-- that start. A group's note is dropped when it has no due task left.
local SLOT = 'slot'

-- The later of two times, either of which may be false.
local function later(a, b)
  if not a or (b and b > a) then
    return b
  end
  return a
end

-- Until when a note (false for none) held a task that starts ``now``, or false.
local function held_by(note, now)
  if note == SLOT then
    return now
  end
  local at = tonumber(note)
  return at and math.min(at, now) or false
end

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

-- A rate ("<count>|<period ms>|<burst>") as its interval (ms per unit of cost) and burst;
-- nil for none (or anything else).
local function rate_parts(rate)
  local count, period, burst = string.match(rate or '', '^(%d+)|(%d+)|(%d+)$')
  if not count or tonumber(count) == 0 then
    return nil
  end
  return tonumber(period) / tonumber(count), tonumber(burst)
end

-- GCRA: when a task of ``cost`` may start, given the stored theoretical arrival time
-- (``stored``, or nil), and the arrival time its start leaves. Up to burst may start at
-- once, then one per interval. A cost above the burst starts only once the limit is
-- idle. A start that comes less than one interval (or 1 ms, the clock's step, if that is
-- longer) after its time keeps the schedule: a claim comes a moment after a rate lets go,
-- and without it every start would lose that moment (400/s gave 333/s at most, and any
-- burst of 1 at most one start per ms); with it the average is exact, and a span of one
-- period holds at most count + burst. Past 1,000/s (an interval under the clock's 1 ms
-- step), "now" stands for the whole millisecond: starts due within it may go, or a burst
-- of 1 would allow one start per ms; a span then holds 2 ms worth of starts more.
local function gcra(stored, interval, burst, cost, now)
  local tat = stored or now
  if tat < now - math.max(interval, 1) then
    tat = now
  end
  local within = interval < 1 and 0.999 or 0
  return tat - math.max(0, burst - cost) * interval - within, tat + cost * interval
end

-- When a task of ``cost`` may start under ``rate`` (now when there is none), and the
-- arrival time its start leaves (false when there is no rate): gcra() on the stored state.
local function rate_check(tats_key, member, rate, cost, now)
  local interval, burst = rate_parts(rate)
  if not interval then
    return now, false
  end
  return gcra(tonumber(redis.call('ZSCORE', tats_key, member)), interval, burst, cost, now)
end

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

-- Note a rate limit's wait (``group`` may start again at ``at``) for the dispatchers,
-- waking one when it comes before every other wait.
local function throttle(throttled_key, wake_key, group, at)
  local head = redis.call('ZRANGE', throttled_key, 0, 0, 'WITHSCORES')
  redis.call('ZADD', throttled_key, at, group)
  if not head[2] or at < tonumber(head[2]) then
    if redis.call('LLEN', wake_key) == 0 then
      redis.call('RPUSH', wake_key, 1)
    end
  end
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

-- The running count of the queue (cap) as a call goes: read once, healed at the cap.
local queue_running = false

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

-- After this call's picks (pick_many, feed): complete held_until of the tasks it started
-- with the notes of holds_key (as they were before the call), then keep the notes: a
-- group (the queue, at its cap) refused for a slot is noted SLOT; after a start, a group
-- with no due task left loses its note, and a SLOT note whose group (or queue) had room
-- again is dropped, its hold over. A script without the key leaves them as they are.
local function note_holds(holds_key, now)
  local groups = {}
  for group in pairs(looked) do
    groups[#groups + 1] = group
  end
  if #groups == 0 then
    return
  end
  local notes = redis.call('HMGET', holds_key, QUEUE_GROUP, unpack(groups))
  local queue_note, note_of = notes[1] or false, {}
  for n, group in ipairs(groups) do
    note_of[group] = notes[n + 1] or false
  end
  for id, group in pairs(started_group) do
    held_until[id] = later(held_until[id], later(held_by(note_of[group], now),
      held_by(queue_note, now)))
  end
  local slots, gone = {}, {}
  for group, look in pairs(looked) do
    local why, started, drained = look[1], look[2], look[3]
    if why == 'busy' then
      slots[#slots + 1] = group
      slots[#slots + 1] = SLOT
    elseif started and note_of[group] and (drained or note_of[group] == SLOT) then
      gone[#gone + 1] = group
    end
  end
  if queue_look.capped then
    slots[#slots + 1] = QUEUE_GROUP
    slots[#slots + 1] = SLOT
  elseif queue_look.started and queue_note == SLOT
      and (not queue_look.room or queue_look.room > 0) then
    gone[#gone + 1] = QUEUE_GROUP
  end
  if #slots > 0 then
    redis.call('HSET', holds_key, unpack(slots))
  end
  if #gone > 0 then
    redis.call('HDEL', holds_key, unpack(gone))
  end
  started_group, looked, queue_look = {}, {}, {}
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

-- Read each flow key a script may write, before its first write: a key of the wrong type
-- then fails the call with nothing written (a script that fails half way keeps the
-- writes it made).
local function probe_flow(records_key, due_key, turns_key, throttled_key, tats_key, running_key)
  redis.call('HGET', records_key, '')
  redis.call('ZSCORE', due_key, '')
  redis.call('ZSCORE', turns_key, '')
  redis.call('ZSCORE', throttled_key, '')
  redis.call('ZSCORE', tats_key, '')
  redis.call('ZSCORE', running_key, '')
end

-- Whether the queue is under flow control; if it is, every key a release writes is read
-- first (the flow keys, and ``list_key``: the ready or wake list it may push to), so
-- that one of the wrong type fails the call with nothing written.
local function flow_to_release(config_key, records_key, due_key, turns_key, throttled_key,
                               tats_key, running_key, list_key)
  if not flow_on(config_key) then
    return false
  end
  redis.call('LLEN', list_key)
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

-- Read every key file_now writes, before a script's first write (see probe_flow). Its
-- keys come as feed's, then holds_key.
local function probe_file_now(records_key, due_key, turns_key, throttled_key, tats_key,
                              running_key, leases_key, wake_key, ready_key, holds_key)
  redis.call('LLEN', ready_key)
  redis.call('LLEN', wake_key)
  redis.call('ZSCORE', leases_key, '')
  probe_flow(records_key, due_key, turns_key, throttled_key, tats_key, running_key)
  redis.call('HGET', holds_key, '')
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
