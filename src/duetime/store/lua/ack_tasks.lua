-- ack_tasks: finish a batch of successful attempts, storing results where asked.
-- KEYS[1] active     LIST  this worker's processing list
-- KEYS[2] leases     ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[3] attempts   HASH
-- KEYS[4] tasks      HASH
-- KEYS[5] errors     HASH  task id -> last error record
-- KEYS[6] stats      HASH
-- KEYS[7] minutes    HASH  "<minute>:<figure>" -> per-minute figures
-- KEYS[8..] result keys, one per task whose result TTL is > 0, in the order of the quints
-- ARGV[1] now (ms)
-- ARGV[2] worker id
-- ARGV[3] msgpack array, flat quints: task id, attempt, result TTL (ms, 0 = keep none),
--         result blob, start lateness (µs, how long after its run-at the attempt started)
-- Returns: one integer per task, 1 = acked, 0 = fenced (lease expired or attempt
-- superseded: the outcome is dropped and counted).
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
--
-- The acked tasks' leases and attempts are read, and their records deleted, with one
-- variadic command per step for the whole batch (ZMSCORE, HMGET, ZREM, HDEL): a script's
-- commands cost the server more than their work. A worker acks at most 500 tasks per
-- call, well within what unpack() can spread on Lua's stack. LREM goes id by id.

local now = tonumber(ARGV[1])
local worker = ARGV[2]
local out = {}
local done, done_members = {}, {}
local finished = {} -- ids acked earlier in this batch: a second outcome finds no lease
local acked, fenced = 0, 0
local late_sum, late_max = 0, 0
local result_key = 8
local quints = cmsgpack.unpack(ARGV[3])
if #quints == 0 then
  return out
end
local ids, members = {}, {}
for i = 1, #quints, 5 do
  ids[#ids + 1] = quints[i]
  members[#members + 1] = worker .. '|' .. quints[i]
end
local deadlines = redis.call('ZMSCORE', KEYS[2], unpack(members))
local attempts = redis.call('HMGET', KEYS[3], unpack(ids))
for n = 1, #ids do
  local i = 5 * n - 4
  local id, ttl, member = ids[n], quints[i + 2], members[n]
  local deadline = not finished[id] and deadlines[n]
  if deadline and tonumber(deadline) > now and tonumber(attempts[n]) == quints[i + 1] then
    finished[id] = true
    redis.call('LREM', KEYS[1], 1, id)
    done[#done + 1] = id
    done_members[#done_members + 1] = member
    if ttl > 0 then
      redis.call('DEL', KEYS[result_key])
      redis.call('RPUSH', KEYS[result_key], quints[i + 3])
      redis.call('PEXPIRE', KEYS[result_key], ttl)
    end
    acked = acked + 1
    local late = math.max(0, tonumber(quints[i + 4]) or 0)
    late_sum = late_sum + late
    late_max = math.max(late_max, late)
    out[#out + 1] = 1
  else
    fenced = fenced + 1
    out[#out + 1] = 0
  end
  if ttl > 0 then
    result_key = result_key + 1
  end
end
if #done > 0 then
  redis.call('ZREM', KEYS[2], unpack(done_members))
  redis.call('HDEL', KEYS[3], unpack(done))
  redis.call('HDEL', KEYS[4], unpack(done))
  redis.call('HDEL', KEYS[5], unpack(done))
end
if acked > 0 then
  redis.pcall('HINCRBY', KEYS[6], 'completed', acked)
  local minute = math.floor(now / 60000) .. ':'
  redis.pcall('HINCRBY', KEYS[7], minute .. 'completed', acked)
  redis.pcall('HINCRBY', KEYS[7], minute .. 'late_sum_us', late_sum)
  local known = tonumber(redis.call('HGET', KEYS[7], minute .. 'late_max_us'))
  if not known or late_max > known then
    redis.call('HSET', KEYS[7], minute .. 'late_max_us', late_max)
  end
end
if fenced > 0 then
  redis.pcall('HINCRBY', KEYS[6], 'fenced', fenced)
end
return out
