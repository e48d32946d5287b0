-- release_worker: graceful shutdown; hand every task still in the worker's list back
-- to the head of ready (the interrupted attempt does not count) and deregister.
-- KEYS[1] workers    ZSET
-- KEYS[2] active     LIST  the worker's processing list
-- KEYS[3] leases     ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[4] attempts   HASH
-- KEYS[5] ready      LIST
-- KEYS[6] stats      HASH
-- KEYS[7] reaped     ZSET  worker id -> when a dispatcher looks at its list once more (ms)
-- KEYS[8] tasks      HASH  task id -> envelope
-- KEYS[9] early      HASH  task id -> ARGV[4]: the next attempt's lateness counts from the
--          hand-back (a note already there, of an id never claimed, is kept)
-- KEYS[10] limits    HASH  flow control (flow.lua: config_key); while it exists, the
--          tasks' slots are freed and a task that may start is put in ready
-- KEYS[11] flow records HASH  (flow.lua)
-- KEYS[12] due          ZSET  (flow.lua)
-- KEYS[13] turns        ZSET  (flow.lua)
-- KEYS[14] throttled    ZSET  (flow.lua)
-- KEYS[15] rate state   ZSET  (flow.lua)
-- KEYS[16] running      ZSET  (flow.lua)
-- KEYS[17] wake      LIST
-- KEYS[18] cancelling HASH  task id -> when its cancel was asked (cancelling.lua): such a
--          task ends as cancelled rather than going back
-- KEYS[19] errors    HASH
-- KEYS[20] history state HASH  (history.lua)
-- KEYS[21] history       LIST  (history.lua)
-- KEYS[22] history tasks ZSET  (history.lua)
-- ARGV[1] worker id
-- ARGV[2] when to look at the list once more (ms): a BLMOVE the stop cut off on the
--         client side may still be pending on the server and land an id there
-- ARGV[3] outcomes the worker dropped itself (fenced) and has not yet counted
-- ARGV[4] now (ms)
-- Returns: number of tasks handed back (those ended as cancelled are counted as such). An id without an envelope is not a task (written
-- by hand or by another program): it is dropped with its lease and attempt count, and
-- counted as dropped_unknown, never handed back.
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- @include probes
-- @include taking_back
-- @include flow_release
-- @include early
-- @include history
local worker = ARGV[1]
local now = tonumber(ARGV[4])
local ids, envelopes, known = listed_tasks(KEYS[2], KEYS[8])
-- What is written below is read here first (probes.lua).
probe_zsets(KEYS[1], KEYS[3], KEYS[7])
probe_hashes(KEYS[4])
probe_lists(KEYS[5])
local flowing = flow_to_release(KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16],
  KEYS[17])
local asked, cancelled = cancels_among(KEYS[18], known, KEYS[19])
local members, kept, kept_members, ended_members, records = {}, {}, {}, {}, {}
for i, id in ipairs(ids) do
  members[i] = worker .. '|' .. id
  if envelopes[i] and asked[id] then
    ended_members[#ended_members + 1] = members[i]
    records[#ended_members] = history_record(id, task_name_of(envelopes[i]), HISTORY_CANCELLED,
      tonumber(redis.call('HGET', KEYS[4], id)) or 0, now, worker)
  else
    kept[#kept + 1], kept_members[#kept_members + 1] = id, members[i]
  end
end
local handed, unknown = 0, 0
-- Walk backwards so LPUSH keeps their order at the head of ready.
for i = #ids, 1, -1 do
  local id = ids[i]
  local leased = redis.call('ZREM', KEYS[3], worker .. '|' .. id) == 1
  if not envelopes[i] then
    redis.call('HDEL', KEYS[4], id)
    unknown = unknown + 1
  elseif not asked[id] then -- (one whose cancel was asked ends as cancelled below)
    if leased then
      -- Read, not HINCRBY: an attempt counter that is not a number must not fail the
      -- hand-back half way (the next claim reports it).
      local started = tonumber(redis.call('HGET', KEYS[4], id) or '0')
      if started and started > 1 then
        redis.call('HSET', KEYS[4], id, started - 1)
      elseif started then
        redis.call('HDEL', KEYS[4], id)
      end
    end
    redis.call('LPUSH', KEYS[5], id)
    note_due_at(KEYS[9], id, ARGV[4])
    handed = handed + 1
  end
end
redis.call('DEL', KEYS[2])
end_taken_cancelled(flowing, KEYS[11], KEYS[16], KEYS[12], KEYS[13], KEYS[14], KEYS[18], KEYS[8],
  KEYS[4], KEYS[19], KEYS[9], KEYS[6], cancelled, ended_members)
record_history(#cancelled > 0 and history_open(KEYS[20]), KEYS[20], KEYS[21], KEYS[22],
  cancelled, records)
if flowing and #ids > 0 then
  release_and_feed(KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16],
    KEYS[3], KEYS[17], KEYS[5], kept, kept_members, false, now)
end
redis.call('ZREM', KEYS[1], worker)
redis.call('ZADD', KEYS[7], ARGV[2], worker)
if handed > 0 then
  redis.pcall('HINCRBY', KEYS[6], 'handed_back', handed)
end
if unknown > 0 then
  redis.pcall('HINCRBY', KEYS[6], 'dropped_unknown', unknown)
end
if tonumber(ARGV[3]) > 0 then
  redis.pcall('HINCRBY', KEYS[6], 'fenced', ARGV[3])
end
return handed
