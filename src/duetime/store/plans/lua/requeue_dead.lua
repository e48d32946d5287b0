-- requeue_dead: give dead tasks a fresh set of attempts and snoozes, due now.
-- KEYS[1] dead       ZSET
-- KEYS[2] attempts   HASH
-- KEYS[3] errors     HASH
-- KEYS[4] ready      LIST
-- KEYS[5] stats      HASH
-- KEYS[6] early      HASH  task id -> ARGV[1]: its lateness counts from the requeue
-- KEYS[7] tasks      HASH  task id -> envelope: a snooze count in it is dropped (snoozes.lua)
-- ARGV[1] now (ms)
-- ARGV[2..] task ids
-- Returns: the ids requeued, in the order given (ids not in dead are left alone).
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- @include probes
-- @include snoozes
-- What is written below is read here first (probes.lua).
if #ARGV > 0 then
  probe_hashes(KEYS[7], KEYS[2], KEYS[3])
  probe_lists(KEYS[4])
end
local requeued = {}
for i = 2, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    local unsnoozed = unsnoozed_envelope(redis.call('HGET', KEYS[7], id))
    if unsnoozed then
      redis.call('HSET', KEYS[7], id, unsnoozed)
    end
    redis.call('RPUSH', KEYS[4], id)
    redis.pcall('HSET', KEYS[6], id, ARGV[1]) -- pcall: a damaged key must not fail the step
    requeued[#requeued + 1] = id
  end
end
if #requeued > 0 then
  redis.pcall('HINCRBY', KEYS[5], 'requeued', #requeued)
end
return requeued
