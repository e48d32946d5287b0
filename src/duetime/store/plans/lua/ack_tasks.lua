-- ack_tasks: finish a batch of successful attempts, storing results where asked.
-- KEYS[1] active     LIST  this worker's processing list
-- KEYS[2] leases     ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[3] attempts   HASH
-- KEYS[4] tasks      HASH
-- KEYS[5] errors     HASH  task id -> last error record
-- KEYS[6] stats      HASH
-- KEYS[7] minutes    HASH  "<minute>:<figure>" -> per-minute figures
-- KEYS[8] limits    HASH  flow control (flow.lua: config_key); while it exists, the
--          tasks' slots are freed and a task that may start is put in ready
-- KEYS[9] flow records HASH  (flow.lua)
-- KEYS[10] due          ZSET  (flow.lua)
-- KEYS[11] turns        ZSET  (flow.lua)
-- KEYS[12] throttled    ZSET  (flow.lua)
-- KEYS[13] rate state   ZSET  (flow.lua)
-- KEYS[14] running      ZSET  (flow.lua)
-- KEYS[15] wake      LIST
-- KEYS[16] ready     LIST
-- KEYS[17] history state HASH  (history.lua)
-- KEYS[18] history       LIST  (history.lua)
-- KEYS[19] history tasks ZSET  (history.lua)
-- KEYS[20] cancelling HASH  task id -> when its cancel was asked (cancelling.lua): such a
--          task ends as cancelled, not completed (its result, if kept, says so)
-- KEYS[21] holds      HASH  (flow.lua): a key the feed finds running all it may is noted
-- KEYS[22..] result keys, one per task whose result TTL is > 0, in the order of the sextets
-- ARGV[1] now (ms)
-- ARGV[2] worker id
-- ARGV[3] msgpack array, flat sextets: task id, attempt, result TTL (ms, 0 = keep none),
--         result blob, start lateness (µs, how long after its run-at the attempt started),
--         the attempt's record for the history (history.lua, packed by the worker)
-- ARGV[4] (optional) msgpack array, one per sextet: how long (µs) flow control's limits
--         held the task before it could start (metrics.md): added up per minute apart
--         from lateness, as held_sum_us and held_max_us
-- Returns: one integer per task, 1 = acked, 0 = fenced (lease expired or attempt
-- superseded: the outcome is dropped and counted), 2 = ended as cancelled (its cancel
-- was asked while it ran).
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
--
-- The acked tasks' leases and attempts are read, and their records deleted, with one
-- variadic command per step for the whole batch (ZMSCORE, HMGET, ZREM, HDEL): a script's
-- commands cost the server more than their work. A worker acks at most 500 tasks per
-- call, well within what unpack() can spread on Lua's stack. LREM goes id by id.
-- @include probes
-- @include fence
-- @include result
-- @include chunks
-- @include cancelling
-- @include history
-- @include flow_release
-- @include flow_holds

local now = tonumber(ARGV[1])
local worker = ARGV[2]
local out = {}
local done, done_members = {}, {}
local finished = {} -- ids acked earlier in this batch: a second outcome finds no lease
local acked, fenced = 0, 0
local late_sum, late_max = 0, 0
local held_sum, held_max = 0, 0
local helds = ARGV[4] and cmsgpack.unpack(ARGV[4]) or {}
local result_index = 22
local sextets = cmsgpack.unpack(ARGV[3])
if #sextets == 0 then
  return out
end
local ids, members = {}, {}
for i = 1, #sextets, 6 do
  ids[#ids + 1] = sextets[i]
  members[#members + 1] = worker .. '|' .. sextets[i]
end
local deadlines = redis.call('ZMSCORE', KEYS[2], unpack(members))
local attempts = redis.call('HMGET', KEYS[3], unpack(ids))
local results = {} -- n -> KEYS index of the task's result key, when it has a TTL
for n = 1, #ids do
  local i = 6 * n - 5
  local id, ttl, member = ids[n], sextets[i + 2], members[n]
  if ttl > 0 then
    results[n] = result_index
    result_index = result_index + 1
  end
  local deadline = not finished[id] and deadlines[n]
  if lease_runs(deadline, now) and is_attempt(attempts[n], sextets[i + 1]) then
    finished[id] = true
    done[#done + 1] = id
    done_members[#done_members + 1] = member
    acked = acked + 1
    local late = math.max(0, tonumber(sextets[i + 4]) or 0)
    late_sum = late_sum + late
    late_max = math.max(late_max, late)
    local held = math.max(0, tonumber(helds[n]) or 0)
    held_sum = held_sum + held
    held_max = math.max(held_max, held)
    out[#out + 1] = 1
  else
    fenced = fenced + 1
    out[#out + 1] = 0
  end
end
-- A script that fails half way keeps the writes it made: every key written below is
-- read first (a read of the wrong type fails too), or is the first write (the worker's
-- list), so a key of the wrong type fails the call with nothing written. A result key
-- is replaced whole (DEL first), whatever it held; counters are bumped with pcall.
local minute = math.floor(now / 60000) .. ':'
local known = false
if #done > 0 then
  probe_hashes(KEYS[4], KEYS[5])
  -- pcall: a per-minute figure never fails the step (a minutes key of the wrong type is
  -- left as it is).
  known = redis.pcall('HGET', KEYS[7], minute .. 'late_max_us')
end
local known_held = held_sum > 0 and redis.pcall('HGET', KEYS[7], minute .. 'held_max_us')
local asked = cancels_asked(KEYS[20], done)
local cancelled = next(asked) and split_cancelled(done, asked, true) or {}
if #cancelled > 0 then -- rare: the lateness figures are of the completed ones only
  late_sum, late_max, held_sum, held_max = 0, 0, 0, 0
  for n = 1, #ids do
    if out[n] == 1 and not asked[ids[n]] then
      local late = math.max(0, tonumber(sextets[6 * n - 1]) or 0)
      late_sum = late_sum + late
      late_max = math.max(late_max, late)
      local held = math.max(0, tonumber(helds[n]) or 0)
      held_sum = held_sum + held
      held_max = math.max(held_max, held)
    end
  end
end
local history = #done > 0 and history_open(KEYS[17])
local flowing = #done > 0 and flow_to_release(KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12],
  KEYS[13], KEYS[14], KEYS[16])
if flowing then
  probe_lists(KEYS[15])
  probe_hashes(KEYS[21])
end
for n = 1, #ids do
  if out[n] == 1 then
    redis.call('LREM', KEYS[1], 1, ids[n])
    local key = results[n]
    if asked[ids[n]] then
      out[n] = 2
      if key then
        keep_result(KEYS[key], ended_result(now, sextets[6 * n - 4], 'cancelled'),
          sextets[6 * n - 3])
      end
    elseif key then
      keep_result(KEYS[key], sextets[6 * n - 2], sextets[6 * n - 3])
    end
  end
end
if #done > 0 then
  redis.call('ZREM', KEYS[2], unpack(done_members))
  redis.call('HDEL', KEYS[3], unpack(done))
  redis.call('HDEL', KEYS[4], unpack(done))
  redis.call('HDEL', KEYS[5], unpack(done))
end
if flowing then
  release_and_feed(KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14],
    KEYS[2], KEYS[15], KEYS[16], done, done_members, true, now)
  note_holds(KEYS[21], now)
end
if #cancelled > 0 then
  in_chunks(cancelled, function(first, last)
    redis.call('HDEL', KEYS[20], unpack(cancelled, first, last))
  end)
  redis.pcall('HINCRBY', KEYS[6], 'cancelled', #cancelled)
end
local completed = acked - #cancelled
if completed > 0 then
  redis.pcall('HINCRBY', KEYS[6], 'completed', completed)
  redis.pcall('HINCRBY', KEYS[7], minute .. 'completed', completed)
end
if completed > 0 then
  redis.pcall('HINCRBY', KEYS[7], minute .. 'late_sum_us', late_sum)
  if type(known) ~= 'table' and (not tonumber(known) or late_max > tonumber(known)) then
    redis.pcall('HSET', KEYS[7], minute .. 'late_max_us', late_max)
  end
end
if completed > 0 and held_sum > 0 then
  redis.pcall('HINCRBY', KEYS[7], minute .. 'held_sum_us', held_sum)
  if type(known_held) ~= 'table'
      and (not tonumber(known_held) or held_max > tonumber(known_held)) then
    redis.pcall('HSET', KEYS[7], minute .. 'held_max_us', held_max)
  end
end
if fenced > 0 then
  redis.pcall('HINCRBY', KEYS[6], 'fenced', fenced)
end
if history then
  local records = {}
  for n = 1, #ids do
    if out[n] == 2 then
      local record = cmsgpack.unpack(sextets[6 * n])
      record[3] = HISTORY_CANCELLED
      records[#records + 1] = cmsgpack.pack(record)
    elseif out[n] == 1 then
      records[#records + 1] = sextets[6 * n]
    end
  end
  record_history(history, KEYS[17], KEYS[18], KEYS[19], done, records)
end
return out
