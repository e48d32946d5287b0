-- give_back_task: a task id a worker's BLMOVE took while the worker had no free slot
-- (another shard's claimer filled it meanwhile) goes back to the head of ready, to be
-- taken next by any worker. It was never leased, so no attempt is counted. An id without
-- an envelope is not a task (written by hand or by another program): it is dropped and
-- counted as dropped_unknown instead.
-- KEYS[1] active     LIST  the worker's processing list
-- KEYS[2] ready      LIST
-- KEYS[3] tasks      HASH  task id -> envelope
-- KEYS[4] stats      HASH
-- KEYS[5] cancelling HASH  task id -> when its cancel was asked (cancelling.lua): such a
--          task ends as cancelled rather than going back
-- KEYS[6] attempts   HASH
-- KEYS[7] errors     HASH
-- KEYS[8] early      HASH
-- KEYS[9] flow records HASH (flow_records.lua)
-- KEYS[10] history state HASH  (history.lua)
-- KEYS[11] history       LIST  (history.lua)
-- KEYS[12] history tasks ZSET  (history.lua)
-- ARGV[1] task id
-- ARGV[2] now (ms)
-- ARGV[3] worker id
-- Returns: 1 if the id was in the worker's list and went back (or was dropped, or ended
-- as cancelled), 0 if it was not there.
-- @include probes
-- @include cancelling
-- @include history
-- Read before the first write: a ready list of the wrong type fails the call with
-- nothing written (probes.lua).
probe_lists(KEYS[2])
local id = ARGV[1]
local known = redis.call('HGET', KEYS[3], id)
local cancelling = known and cancels_asked(KEYS[5], {id})[id]
local attempt
if cancelling then
  attempt = tonumber(redis.call('HGET', KEYS[6], id)) or 0
  probe_hashes(KEYS[7], KEYS[9])
end
if redis.call('LREM', KEYS[1], 1, id) == 0 then
  return 0
end
if cancelling then
  redis.call('HDEL', KEYS[9], id) -- never leased: it holds no flow slot
  forget_cancelled(KEYS[5], KEYS[3], KEYS[6], KEYS[7], KEYS[8], KEYS[4], {id})
  record_history(history_open(KEYS[10]), KEYS[10], KEYS[11], KEYS[12], {id},
    {history_record(id, task_name_of(known), HISTORY_CANCELLED, attempt, tonumber(ARGV[2]),
      ARGV[3])})
elseif known then
  redis.call('LPUSH', KEYS[2], id)
else
  redis.pcall('HINCRBY', KEYS[4], 'dropped_unknown', 1)
end
return 1
