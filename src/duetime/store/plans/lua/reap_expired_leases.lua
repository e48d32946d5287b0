-- reap_expired_leases: re-enter tasks whose lease ran out (worker hung, partitioned or slow).
-- KEYS[1] leases     ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[2] scheduled  ZSET
-- KEYS[3] wake       LIST
-- KEYS[4] stats      HASH
-- KEYS[5] tasks      HASH  task id -> envelope
-- KEYS[6] early      HASH  task id -> now: the next attempt's lateness counts from here (a
--          note already there, of an id never claimed, is the earlier due time: kept)
-- KEYS[7] limits    HASH  flow control (flow.lua: config_key); while it exists, the
--          tasks' slots are freed, the tasks taken back go among the due at their rank,
--          and a task that may start is put in ready
-- KEYS[8] flow records HASH  (flow.lua)
-- KEYS[9] due          ZSET  (flow.lua)
-- KEYS[10] turns        ZSET  (flow.lua)
-- KEYS[11] throttled    ZSET  (flow.lua)
-- KEYS[12] rate state   ZSET  (flow.lua)
-- KEYS[13] running      ZSET  (flow.lua)
-- KEYS[14] ready     LIST
-- KEYS[15] attempts  HASH  task id -> attempts started (the history names the lost one)
-- KEYS[16] history state HASH  (history.lua)
-- KEYS[17] history       LIST  (history.lua)
-- KEYS[18] history tasks ZSET  (history.lua)
-- KEYS[19] cancelling HASH  task id -> when its cancel was asked (cancelling.lua): such a
--          task ends as cancelled rather than re-entering
-- KEYS[20] errors    HASH  task id -> last error record
-- KEYS[21..] the processing lists of the lease holders
-- ARGV[1] now (ms)
-- ARGV[2..] pairs: lease member, index in KEYS of its holder's processing list
-- Each deadline is checked again here, so a lease renewed after the caller read it stays.
-- Returns: number of tasks re-entered: into scheduled (due now), or under flow control
-- straight among the due at the rank they had (flow_filing.lua: reenter_due). An id
-- without an envelope is not a task (written by hand or by another program): it leaves
-- the holder's list and is counted as dropped_unknown, never re-entered.
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- Each re-entered task's lost attempt is recorded in the history (a cancelled one's end).
-- Ended as cancelled tasks are counted as cancelled, not in the number returned.
-- @include probes
-- @include taking_back
-- @include flow_release
-- @include flow_filing
-- @include wake
-- @include history
local now = tonumber(ARGV[1])
local count, unknown = 0, 0
-- What is written below is read here first (probes.lua).
probe_zsets(KEYS[1], KEYS[2])
probe_lists(KEYS[3])
probe_hashes(KEYS[5])
for key = 21, #KEYS do
  probe_lists(KEYS[key])
end
local flowing = flow_to_release(KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13],
  KEYS[14])
local ended, ended_leases = {}, {}
local history = history_open(KEYS[16])
local lost, records = {}, {}
local reentered = {}
local candidates = {}
for i = 2, #ARGV, 2 do
  local bar = string.find(ARGV[i], '|', 1, true)
  if bar then
    candidates[#candidates + 1] = string.sub(ARGV[i], bar + 1)
  end
end
local asked = cancels_among(KEYS[19], candidates, KEYS[15], KEYS[20])
local cancelled, cancelled_leases = {}, {}
for i = 2, #ARGV, 2 do
  local member = ARGV[i]
  local deadline = redis.call('ZSCORE', KEYS[1], member)
  local bar = string.find(member, '|', 1, true)
  if deadline and tonumber(deadline) <= now then
    redis.call('ZREM', KEYS[1], member)
  end
  -- A member without "|" was not written by duetime: dropped above, nothing to re-enter.
  if bar and deadline and tonumber(deadline) <= now then
    local id = string.sub(member, bar + 1)
    local removed = redis.call('LREM', KEYS[tonumber(ARGV[i + 1])], 1, id) > 0
    local envelope = removed and redis.call('HGET', KEYS[5], id)
    if envelope and asked[id] then
      cancelled[#cancelled + 1] = id
      cancelled_leases[#cancelled_leases + 1] = member
    else
      ended[#ended + 1] = id
      ended_leases[#ended_leases + 1] = member
    end
    if removed then
      if envelope and asked[id] then
        if history then
          local attempt = tonumber(redis.pcall('HGET', KEYS[15], id)) or 0
          lost[#lost + 1] = id
          records[#lost] = history_record(id, task_name_of(envelope), HISTORY_CANCELLED,
            attempt, now, string.sub(member, 1, bar - 1))
        end
      elseif envelope then
        if flowing then
          reentered[#reentered + 1] = id
        else
          redis.call('ZADD', KEYS[2], now, id)
        end
        redis.pcall('HSETNX', KEYS[6], id, ARGV[1]) -- pcall: a damaged key must not fail the step
        count = count + 1
        if history then
          local attempt = tonumber(redis.pcall('HGET', KEYS[15], id)) or 0
          lost[#lost + 1] = id
          records[#lost] = history_record(id, task_name_of(envelope), HISTORY_LOST, attempt,
            now, string.sub(member, 1, bar - 1))
        end
      else
        unknown = unknown + 1
      end
    end
  end
end
end_taken_cancelled(flowing, KEYS[8], KEYS[13], KEYS[9], KEYS[10], KEYS[11], KEYS[19], KEYS[5],
  KEYS[15], KEYS[20], KEYS[6], KEYS[4], cancelled, cancelled_leases)
if flowing and #ended + #cancelled > 0 then
  reenter_due(KEYS[8], KEYS[9], reentered, now)
  release_and_feed(KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13],
    KEYS[1], KEYS[3], KEYS[14], ended, ended_leases, false, now)
end
if count > 0 then
  wake_if(KEYS[3], not flowing) -- re-entered tasks are due now (among the due: fed)
  redis.pcall('HINCRBY', KEYS[4], 'expired_leases', count)
end
if unknown > 0 then
  redis.pcall('HINCRBY', KEYS[4], 'dropped_unknown', unknown)
end
record_history(history, KEYS[16], KEYS[17], KEYS[18], lost, records)
return count
