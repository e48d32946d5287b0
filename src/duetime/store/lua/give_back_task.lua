-- give_back_task: a task id a worker's BLMOVE took while the worker had no free slot
-- (another shard's claimer filled it meanwhile) goes back to the head of ready, to be
-- taken next by any worker. It was never leased, so no attempt is counted.
-- KEYS[1] active     LIST  the worker's processing list
-- KEYS[2] ready      LIST
-- ARGV[1] task id
-- Returns: 1 if the id was in the worker's list and went back, 0 if it was not there.
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 0 then
  return 0
end
redis.call('LPUSH', KEYS[2], ARGV[1])
return 1
