-- claim_tasks: lease tasks to one worker, taking up to ARGV[4] more from ready.
-- KEYS[1] ready      LIST
-- KEYS[2] active     LIST  this worker's processing list
-- KEYS[3] leases     ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[4] attempts   HASH  task id -> attempts started
-- KEYS[5] tasks      HASH  task id -> envelope
-- KEYS[6] workers    ZSET  worker id -> last heartbeat (ms)
-- KEYS[7] early      HASH  task id -> run-at (ms), for ids promoted before their run-at
-- KEYS[8] paused     STRING present while the queue is paused
-- KEYS[9] stats      HASH  counters
-- KEYS[10] limits    HASH  flow control (flow.lua: config_key); while it exists, every
--          id taken is checked against the limits as it starts, and more are picked
--          from the due set by turns and rank rather than from ready alone
-- KEYS[11] flow records HASH  (flow.lua)
-- KEYS[12] due          ZSET  (flow.lua)
-- KEYS[13] turns        ZSET  (flow.lua)
-- KEYS[14] throttled    ZSET  (flow.lua)
-- KEYS[15] rate state   ZSET  (flow.lua)
-- KEYS[16] running      ZSET  (flow.lua)
-- KEYS[17] wake      LIST  the dispatchers' alarm, rung when a rate limit's wait begins
-- KEYS[18] holds     HASH  (flow.lua): a key refused for a slot is noted; read as tasks start
-- ARGV[1] now (ms)
-- ARGV[2] lease deadline (ms)
-- ARGV[3] worker id
-- ARGV[4] most ids to move from ready (under flow control: to start, from ready first,
--         then from the due set)
-- ARGV[5..] ids the worker already moved into its list with BLMOVE
-- Returns: flat sextuples {task id, attempt, envelope, run-at, problem, held until}.
-- run-at (ms) is given for an id promoted ahead of it (the worker waits until then), false
-- otherwise. held until (ms, text) is, under flow control, when the limits let the task
-- go (its lateness counts from then, the wait before is "held": metrics.md), or false.
-- problem is false, or says which of the task's records held garbage (a count or a time
-- that is not a number, written by hand): the task is still leased, with its attempt
-- counter reset to a count, and the worker sends it to dead with that reason, so
-- garbage costs one task, never the claim of its neighbours. An id with no envelope
-- comes back with attempt 0 and envelope false, already dropped from the list.
-- While the queue is paused: claims nothing, puts the ids of ARGV[5..] back at the head
-- of ready (in their order) and returns 'paused'.
--
-- Ids without an envelope are dropped from the list and counted in stats as
-- dropped_unknown.
--
-- Each step of the whole batch is one variadic command (LRANGE, HMGET, HSET, ZADD...),
-- never one per id: a script's command costs the server more than its work, a write
-- most (it is also recorded for replication). Measured on Redis 7.0, this takes 10 to 20%
-- off a claim's server time per task. The early-note lookup is skipped while no note
-- exists.
-- Under flow control an id that may not start yet (its group or the queue is at its
-- limit) goes back to the due set, and is not returned: nothing about it is spent.
-- @include probes
-- @include chunks
-- @include flow_records
-- @include flow
-- @include flow_turns
-- @include flow_claim
-- @include flow_filing
-- @include flow_pick
-- @include flow_holds

local worker = ARGV[3]
-- A script that fails half way keeps the writes it made: every key written below is
-- read first (a read of the wrong type fails too), or is the first write (workers), so a
-- key of the wrong type fails the call with nothing written.
if redis.call('EXISTS', KEYS[8]) == 1 then
  if #ARGV >= 5 then
    probe_lists(KEYS[1], KEYS[2])
  end
  redis.call('ZADD', KEYS[6], ARGV[1], worker)
  for i = #ARGV, 5, -1 do
    if redis.call('LREM', KEYS[2], 1, ARGV[i]) > 0 then
      redis.call('LPUSH', KEYS[1], ARGV[i])
    end
  end
  return 'paused'
end
local now = tonumber(ARGV[1])
local flowing = flow_on(KEYS[10])
if flowing then
  probe_lists(KEYS[1], KEYS[2])
  probe_zsets(KEYS[3])
  probe_flow(KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16])
  probe_hashes(KEYS[18])
end
-- What becomes of an id taken from ready. One with a rank was among the due already (put
-- in ready to wake a blocked worker, or handed back by one): it goes back among the due
-- at its rank, its key gets a turn, and the claim picks by turns and rank below, so that
-- neither a better-ranked task of its key nor another key's turn is passed over: 'back'.
-- One without (it reached ready before the queue came under flow control) starts first
-- if it may: it is counted as started (its slot and its cost of the rates), true; if not
-- it goes among the due, and its group (or the whole queue) waits as the limit says: false.
local function admit(id)
  local _, cost, rank, group = parse_record(redis.call('HGET', KEYS[11], id))
  if rank ~= '' then
    redis.call('ZADD', KEYS[12], 0, group .. '\0' .. rank .. '\0' .. id)
    give_turn(KEYS[13], KEYS[14], group)
    return 'back'
  end
  local hold, at, queue_tat = hold_of(KEYS[10], KEYS[16], KEYS[3], KEYS[15], KEYS[14], group,
    cost, now)
  if not hold then
    start_task(KEYS[16], KEYS[15], group, worker .. '|' .. id, at, queue_tat)
    return true
  end
  refile(KEYS[11], KEYS[12], id, now)
  hold_group(KEYS[13], KEYS[14], KEYS[17], group, hold, at)
  if hold == 'cap' or hold == 'queue' then
    give_turn(KEYS[13], KEYS[14], group)
  end
  return false
end
local ids = {}
local given_back = 0 -- ids of the worker's BLMOVE put back among the due: picked again
for i = 5, #ARGV do
  -- A dead-worker sweep may have taken the id back between BLMOVE and this call.
  if redis.call('LPOS', KEYS[2], ARGV[i]) then
    local admitted = not flowing or admit(ARGV[i])
    if admitted == true then
      ids[#ids + 1] = ARGV[i]
    else
      redis.call('LREM', KEYS[2], 1, ARGV[i])
      given_back = given_back + (admitted == 'back' and 1 or 0)
    end
  end
end
local most = tonumber(ARGV[4])
-- What LMOVE would move id by id: RPUSHed to the worker's list, LTRIMmed from ready below.
local moved = most > 0 and redis.call('LRANGE', KEYS[1], 0, most - 1) or {}
local trim = #moved
if flowing then
  local waiting = moved
  moved = {}
  for _, id in ipairs(waiting) do
    if admit(id) == true then
      moved[#moved + 1] = id
    end
  end
  if #moved < most + given_back then
    local picked = pick_many(KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15],
      KEYS[16], KEYS[3], KEYS[17], now, worker, most + given_back - #moved)
    for _, id in ipairs(picked) do
      moved[#moved + 1] = id
    end
  end
  note_holds(KEYS[18], now)
end
for _, id in ipairs(moved) do
  ids[#ids + 1] = id
end
local noting = redis.call('EXISTS', KEYS[7]) == 1 -- usually no note: then no lookups
local envelopes, counts, notes = {}, {}, {}
in_chunks(ids, function(first, last)
  local found = {
    {envelopes, redis.call('HMGET', KEYS[5], unpack(ids, first, last))},
    {counts, redis.call('HMGET', KEYS[4], unpack(ids, first, last))},
    {notes, noting and redis.call('HMGET', KEYS[7], unpack(ids, first, last)) or {}},
  }
  for _, pair in ipairs(found) do
    for i = 1, last - first + 1 do
      pair[1][first + i - 1] = pair[2][i] or false
    end
  end
end)
if #ids > 0 then
  probe_zsets(KEYS[3])
  if #ARGV < 5 then
    probe_lists(KEYS[2])
  end
end
redis.call('ZADD', KEYS[6], ARGV[1], worker)
in_chunks(moved, function(first, last)
  redis.call('RPUSH', KEYS[2], unpack(moved, first, last))
end)
if trim > 0 then
  redis.call('LTRIM', KEYS[1], trim, -1)
end
local out, counted, leased, noted = {}, {}, {}, {}
local unknown = 0
for n, id in ipairs(ids) do
  local envelope = envelopes[n]
  local note = notes[n]
  local problem = false
  local run_at = false
  if note then
    noted[#noted + 1] = id
    run_at = tonumber(note)
    if not run_at or run_at ~= run_at or math.abs(run_at) == math.huge then
      problem = 'its early run-at note is not a number: ' .. string.sub(note, 1, 40)
      run_at = false
    end
  end
  if envelope then
    local stored = counts[n]
    local started = tonumber(stored or '0')
    if not started or started < 0 or started ~= math.floor(started) or started > 1e9 then
      problem = 'its attempt counter is not a count: ' .. string.sub(stored, 1, 40)
      started = 0
    end
    counted[#counted + 1] = id
    counted[#counted + 1] = started + 1
    leased[#leased + 1] = ARGV[2]
    leased[#leased + 1] = worker .. '|' .. id
    out[#out + 1] = id
    out[#out + 1] = started + 1
    out[#out + 1] = envelope
    out[#out + 1] = run_at and note or false
    out[#out + 1] = problem
    out[#out + 1] = held_until[id] and string.format('%.3f', held_until[id]) or false
  else
    redis.call('LREM', KEYS[2], 1, id)
    unknown = unknown + 1
    out[#out + 1] = id
    out[#out + 1] = 0
    out[#out + 1] = false
    out[#out + 1] = false
    out[#out + 1] = false
    out[#out + 1] = false
  end
end
-- Pairs stay whole: CHUNK is even.
in_chunks(counted, function(first, last)
  redis.call('HSET', KEYS[4], unpack(counted, first, last))
end)
in_chunks(leased, function(first, last)
  redis.call('ZADD', KEYS[3], unpack(leased, first, last))
end)
in_chunks(noted, function(first, last)
  redis.call('HDEL', KEYS[7], unpack(noted, first, last))
end)
if unknown > 0 then
  redis.pcall('HINCRBY', KEYS[9], 'dropped_unknown', unknown)
end
if flowing then
  feed(KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16], KEYS[3], KEYS[17],
    KEYS[1], now)
  note_holds(KEYS[18], now)
end
return out
