-- reap_worker: take back every task of a worker that stopped heartbeating (or of a
-- processing list whose worker is not registered at all) and forget the worker.
-- KEYS[1] workers    ZSET  worker id -> last heartbeat (ms)
-- KEYS[2] active     LIST  that worker's processing list
-- KEYS[3] leases     ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[4] scheduled  ZSET
-- KEYS[5] wake       LIST
-- KEYS[6] stats      HASH
-- KEYS[7] reaped     ZSET  reaped worker id -> when to look at its list once more (ms)
-- KEYS[8] tasks      HASH  task id -> envelope
-- KEYS[9] early      HASH  task id -> now: the next attempt's lateness counts from here (a
--          note already there, of an id never claimed, is the earlier due time: kept)
-- KEYS[10] limits    HASH  flow control (flow.lua: config_key); while it exists, the
--          tasks' slots are freed, the tasks taken back go among the due at their rank,
--          and a task that may start is put in ready
-- KEYS[11] flow records HASH  (flow.lua)
-- KEYS[12] due          ZSET  (flow.lua)
-- KEYS[13] turns        ZSET  (flow.lua)
-- KEYS[14] throttled    ZSET  (flow.lua)
-- KEYS[15] rate state   ZSET  (flow.lua)
-- KEYS[16] running      ZSET  (flow.lua)
-- KEYS[17] ready     LIST
-- KEYS[18] attempts  HASH  task id -> attempts started (the history names the lost one)
-- KEYS[19] history state HASH  (history.lua)
-- KEYS[20] history       LIST  (history.lua)
-- KEYS[21] history tasks ZSET  (history.lua)
-- KEYS[22] cancelling HASH  task id -> when its cancel was asked (cancelling.lua): such a
--          task ends as cancelled rather than re-entering
-- KEYS[23] errors    HASH  task id -> last error record
-- KEYS[24] gone workers LIST  (gone_workers.lua): a reaped worker, its tasks taken back
-- ARGV[1] now (ms)
-- ARGV[2] worker id
-- ARGV[3] stale before (ms): the worker is reaped only if its last heartbeat is older
-- ARGV[4] look again at (ms), or -1: a silent worker may still have a BLMOVE pending on
--         the server, which can move an id into its list after this reap; the list is
--         looked at once more at this time (after the longest block), so such an id is
--         re-entered then rather than at the next maintenance sweep
-- Returns: number of tasks re-entered (into scheduled, due now; under flow control
-- straight among the due at the rank they had: flow_filing.lua, reenter_due), or -1 if
-- the worker heartbeated meanwhile. An id without an envelope is not a task (written by
-- hand or by another program): it is dropped with its lease, and counted as
-- dropped_unknown, never re-entered.
-- reaped_workers counts a worker once, however many dispatchers reap it.
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- Each re-entered task that held a lease lost its attempt: recorded in the history (a
-- cancelled one's end too; those are counted as cancelled, not in the number returned).
-- @include probes
-- @include taking_back
-- @include cancelling
-- @include flow_release
-- @include flow_filing
-- @include early
-- @include wake
-- @include history
-- @include gone_workers
local now = tonumber(ARGV[1])
local worker = ARGV[2]
local beat = redis.call('ZSCORE', KEYS[1], worker)
if beat and tonumber(beat) > tonumber(ARGV[3]) then
  redis.call('ZREM', KEYS[7], worker)
  return -1
end
local listed, envelopes, ids = listed_tasks(KEYS[2], KEYS[8])
local unknown = #listed - #ids
local asked, cancelled = cancels_among(KEYS[22], ids, KEYS[18], KEYS[23])
ids = split_cancelled(ids, asked, false)
-- What is written below is read here first (probes.lua).
probe_zsets(KEYS[3], KEYS[4], KEYS[7])
probe_lists(KEYS[5])
local flowing = flow_to_release(KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16],
  KEYS[17])
local kept, kept_members, ended_members = {}, {}, {}
local history = history_open(KEYS[19])
local lost, records = {}, {}
for n, id in ipairs(listed) do
  local member = worker .. '|' .. id
  local leased = redis.call('ZREM', KEYS[3], member) == 1
  local cancelling = envelopes[n] and asked[id]
  if cancelling then
    ended_members[#ended_members + 1] = member
  else
    kept[#kept + 1], kept_members[#kept_members + 1] = id, member
  end
  if history and envelopes[n] and (leased or cancelling) then
    local attempt = tonumber(redis.pcall('HGET', KEYS[18], id)) or 0
    lost[#lost + 1] = id
    records[#lost] = history_record(id, task_name_of(envelopes[n]),
      cancelling and HISTORY_CANCELLED or HISTORY_LOST, attempt, now, worker)
  end
end
end_taken_cancelled(flowing, KEYS[11], KEYS[16], KEYS[12], KEYS[13], KEYS[14], KEYS[22], KEYS[8],
  KEYS[18], KEYS[23], KEYS[9], KEYS[6], cancelled, ended_members)
if flowing then
  reenter_due(KEYS[11], KEYS[12], ids, now)
end
if flowing and #listed > 0 then
  release_and_feed(KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16],
    KEYS[3], KEYS[5], KEYS[17], kept, kept_members, false, now)
end
for _, id in ipairs(ids) do
  if not flowing then
    redis.call('ZADD', KEYS[4], now, id)
  end
  note_due_at(KEYS[9], id, ARGV[1])
end
redis.call('DEL', KEYS[2])
if redis.call('ZREM', KEYS[1], worker) == 1 then
  redis.pcall('HINCRBY', KEYS[6], 'reaped_workers', 1)
  if tonumber(ARGV[4]) >= 0 then
    redis.call('ZADD', KEYS[7], ARGV[4], worker)
  end
else
  redis.call('ZREM', KEYS[7], worker)
end
if #ids > 0 then
  wake_if(KEYS[5], not flowing) -- re-entered tasks are due now (among the due: fed)
  redis.pcall('HINCRBY', KEYS[6], 'reaped_tasks', #ids)
end
if unknown > 0 then
  redis.pcall('HINCRBY', KEYS[6], 'dropped_unknown', unknown)
end
record_history(history, KEYS[19], KEYS[20], KEYS[21], lost, records)
if beat or #ids > 0 then
  note_gone_worker(KEYS[24], worker, beat, now, ids)
end
return #ids
