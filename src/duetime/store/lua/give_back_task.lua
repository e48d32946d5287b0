-- give_back_task: a task id a worker's BLMOVE took while the worker had no free slot
-- (another shard's claimer filled it meanwhile) goes back to the head of ready, to be
-- taken next by any worker. It was never leased, so no attempt is counted. An id without
-- an envelope is not a task (written by hand or by another program): it is dropped and
-- counted as dropped_unknown instead.
-- KEYS[1] active     LIST  the worker's processing list
-- KEYS[2] ready      LIST
-- KEYS[3] tasks      HASH  task id -> envelope
-- KEYS[4] stats      HASH
-- ARGV[1] task id
-- Returns: 1 if the id was in the worker's list and went back (or was dropped), 0 if it
-- was not there.
-- Read before the first write: a ready list of the wrong type fails the call with
-- nothing written.
redis.call('LLEN', KEYS[2])
local known = redis.call('HGET', KEYS[3], ARGV[1])
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
if known then
  redis.call('LPUSH', KEYS[2], ARGV[1])
else
  redis.pcall('HINCRBY', KEYS[4], 'dropped_unknown', 1)
end
return 1
