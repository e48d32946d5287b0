-- Flow control's keys, and the reads all its parts share (config_key and the flow keys).
-- Flow control: priorities, turns between limit keys, rate limits and concurrency limits.
-- Every limit is checked as a task starts (claim_tasks, with the lease it takes), never
-- before, so none is passed.
--
-- A queue is under flow control while its limits hash (config_key) exists: scheduling a
-- task with a priority or a limit key creates it, declaring a limit too. Its due tasks
-- then wait in the due set rather than in ready, in one group per limit key (tasks
-- without one are the group ""), and a claim takes them group by group in turns.
--   config_key    HASH  cap, rate, each_concurrency, each_rate, concurrency:<group>,
--                       rate:<group> (a rate is "<count>|<period ms>|<burst>"), since
--   records_key   HASH  task id -> "<priority>|<cost>|<rank>|<group>" (rank: empty until
--                       the task is due; flow_records.lua)
--   due_key       ZSET  all scores 0: "<group>\0<rank>\0<task id>", so one range BYLEX
--                       reads a group's best-ranked task. rank: run-at (ms) less 1000 ms
--                       per point of priority, 15 digits
--   turns_key     ZSET  group -> its turn: the groups whose due tasks may be looked at
--   throttled_key ZSET  group -> when its rate limit lets its next task start (ms); the
--                       member "\0" is the queue's own rate limit
--   tats_key      ZSET  group (or "\0") -> its theoretical arrival time (GCRA, ms)
--   running_key   ZSET  all scores 0: "<group>\0<worker>|<task id>" per started task
--   holds_key     HASH  group (or "\0") -> when its latest hold by a limit ended (ms), or
--                       'slot' (see note_holds, flow_holds.lua)
-- A limit key holds no control character, so "\0" and "\1" bound a group's range.
--
-- The parts, one include each, every one including those it uses:
--   flow_turns     the turns, and a rate's wait noted for the dispatchers
--   flow_filing    the dispatcher's: due tasks filed among the due by key, turn and rank
--   flow_limits    the limits of a call, and the slots counted against them (running)
--   flow_rates     the rate limits' state (GCRA)
--   flow_holds     until when limits held each task started, noted for its lateness
--   flow_take      the claim's look at one key: as many of its due tasks as may start
--   flow_pick      the claim's pick from the due set, key by key in turns; and the feed
--                  of ready, which picks one task for a blocked worker
--   flow_claim     the claim's check of a task taken from ready, as it starts
--   flow_release   the end of a lease: its slot given back, its key's turn, the feed
--   flow_schedule  a schedule call's: a task due now filed in the call
-- @include probes

local QUEUE_GROUP = '\0'

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

-- Read each flow key a script may write, before its first write: a key of the wrong type
-- then fails the call with nothing written (a script that fails half way keeps the
-- writes it made).
local function probe_flow(records_key, due_key, turns_key, throttled_key, tats_key, running_key)
  probe_hashes(records_key)
  probe_zsets(due_key, turns_key, throttled_key, tats_key, running_key)
end
