-- heartbeat: mark a worker alive and renew the leases of the attempts it is running.
-- KEYS[1] workers    ZSET  worker id -> last heartbeat (ms)
-- KEYS[2] leases     ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[3] attempts   HASH  task id -> attempts started
-- KEYS[4] active     LIST  the worker's processing list
-- KEYS[5] stats      HASH
-- KEYS[6] cancelling HASH  task id -> when its cancel was asked (cancelling.lua)
-- ARGV[1] now (ms)
-- ARGV[2] new lease deadline (ms)
-- ARGV[3] worker id
-- ARGV[4] outcomes the worker dropped itself since its last heartbeat (fenced), counted
-- ARGV[5..] pairs: task id, attempt
-- Returns: {1 if the worker was still registered else 0, {lost task id, attempt, ...},
-- {ids in the processing list}, {ids named whose cancel was asked}}. A lost attempt's lease had expired or it was superseded
-- by a newer attempt (or it just finished and was acked), so that attempt (the id and the
-- number: never a newer attempt of the same task) is fenced: the worker drops an outcome
-- it still holds and counts it with a later heartbeat. The list lets the worker find ids
-- whose BLMOVE reply it never got.
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- @include fence
-- @include cancelling
local now = tonumber(ARGV[1])
local worker = ARGV[3]
local known = redis.call('ZSCORE', KEYS[1], worker) and 1 or 0
-- A script that fails half way keeps the writes it made: every key written below is read
-- before its first write, so a key of the wrong type fails the call with nothing written.
local held = redis.call('LRANGE', KEYS[4], 0, -1)
local lost = {}
for i = 5, #ARGV, 2 do
  local id = ARGV[i]
  local member = worker .. '|' .. id
  if holds_lease(KEYS[2], KEYS[3], member, id, ARGV[i + 1], now) then
    redis.call('ZADD', KEYS[2], 'XX', ARGV[2], member)
  else
    lost[#lost + 1] = id
    lost[#lost + 1] = ARGV[i + 1]
  end
end
-- After the renewals: a lease is renewed only once both leases and attempts were read.
redis.call('ZADD', KEYS[1], now, worker)
if tonumber(ARGV[4]) > 0 then
  redis.pcall('HINCRBY', KEYS[5], 'fenced', ARGV[4])
end
local named = {}
for i = 5, #ARGV, 2 do
  named[#named + 1] = ARGV[i]
end
local asked = cancels_asked(KEYS[6], named)
return {known, lost, held, split_cancelled(named, asked, true)}
