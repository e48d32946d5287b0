-- schedule_tasks: store a batch of new tasks; an id that is already live is left untouched.
-- KEYS[1] tasks           HASH  task id -> envelope
-- KEYS[2] scheduled       ZSET  task id -> run-at (ms)
-- KEYS[3] ready           LIST  task ids due now
-- KEYS[4] wake            LIST  one-element signal a sleeping dispatcher blocks on
-- KEYS[5] stats           HASH  counters
-- KEYS[6] delayed         ZSET  bucket name -> earliest run-at in that bucket (µs)
-- KEYS[7] delayed_layout  HASH  generation, tasks (how many the buckets hold)
-- KEYS[8] limits          HASH  flow control (flow.lua): while it exists, tasks due now go
--         among the due, by rank and group, rather than to ready
-- KEYS[9] flow records    HASH  task id -> "<priority>|<cost>||<group>" (flow.lua)
-- KEYS[10] due            ZSET  (flow.lua)
-- KEYS[11] turns          ZSET  (flow.lua)
-- KEYS[12] throttled      ZSET  (flow.lua)
-- KEYS[13] rate state     ZSET  (flow.lua)
-- KEYS[14] running        ZSET  (flow.lua)
-- KEYS[15] leases         ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[16] holds          HASH  (flow.lua): a key refused for a slot is noted
-- KEYS[17..] the delayed buckets of this batch (ZSET task id -> run-at in µs), named
--         KEYS[6] .. ':' .. "<generation>:<bucket>"
-- ARGV[1] now (ms, server clock)
-- ARGV[2] the tasks, msgpack: a flat array of six per task: task id, run-at (ms),
--         envelope, index in KEYS of its bucket, run-at as the text of whole µs (handed
--         to ZADD as it is: the server formats a number it is given slowly), flow record
--         ('' for none; any record puts the queue under flow control). One argument
--         rather than six per task: clients pack it in one C call, where a
--         command of thousands of arguments costs them per argument.
-- ARGV[3] the generation the buckets were picked in: becomes the generation if it is
--         newer (a client may open one ahead of time for a large batch)
-- Returns: {generation, how many tasks, {the positions (from 1) of those whose id was
-- already live: nothing changed for them}}; every other task was created. The caller
-- picks buckets in that generation next time. (Positions, not a flag per task: a
-- reply of 1,000 integers cost the server a quarter of a µs a task.)
-- A task due later goes into a small bucket (compact on the server) picked by a hash of
-- its id; a bucket's earliest run-at is its score in `delayed`, which dispatchers follow.
-- How the buckets grow, and when a dispatcher is woken: scheduling.lua (and wake.lua).
-- schedule_task.lua stores the one task of a single call in fewer steps.
-- One HMGET finds the live ids, then one ZADD per bucket, one RPUSH and one HSET write
-- the rest. Clients send at most 1,000 tasks per call, so the unpack()ed lists stay
-- within Lua's stack.
-- @include microseconds
-- @include wake
-- @include scheduling
-- @include flow_mode
-- @include flow_schedule
-- @include probes
local now = tonumber(ARGV[1])
local tasks = cmsgpack.unpack(ARGV[2])
local asked = tonumber(ARGV[3])
local ids = {}
local recorded = false
for i = 1, #tasks, 6 do
  ids[#ids + 1] = tasks[i]
  recorded = recorded or tasks[i + 5] ~= ''
end
local live = redis.call('HMGET', KEYS[1], unpack(ids))
local layout = read_layout(KEYS[7])
local flowing = flow_mode(KEYS[8], KEYS[9], recorded)
local records = {}
local soonest = math.huge  -- the earliest run-at (ms) of this batch's delayed tasks
local refused = {}
local taken = {}  -- ids of this batch already given a place: a repeat is live too
local fields, due, late = {}, {}, {}
local filed, filed_run_ats = {}, {}  -- due now under flow control: among the due at once
local written = 0  -- tasks in fields (counted here: # is a search in Lua 5.1)
-- KEYS index -> {members, earliest run-at (ms), its µs text, how many members}
local buckets, order = {}, {}  -- order: the KEYS indexes in the order first met
local delayed = 0
for n = 1, #ids do
  local id = ids[n]
  if live[n] or taken[id] then
    refused[#refused + 1] = n
  else
    taken[id] = true
    local run_at = tonumber(tasks[6 * n - 4])
    fields[2 * written + 1] = id
    fields[2 * written + 2] = tasks[6 * n - 3]
    written = written + 1
    if tasks[6 * n] ~= '' then
      records[#records + 1] = id
      records[#records + 1] = tasks[6 * n]
    end
    if run_at <= now and not flowing then
      due[#due + 1] = id
    elseif run_at <= now then
      filed[#filed + 1] = id
      filed_run_ats[#filed] = run_at
    else
      if run_at < soonest then
        soonest = run_at
      end
      if run_at * 1000 >= MOST_US then
        late[#late + 1] = run_at
        late[#late + 1] = id
      else
        local key, us = tasks[6 * n - 2], tasks[6 * n - 1]
        local bucket = buckets[key]
        if not bucket then
          bucket = {{}, run_at, us, 0}
          buckets[key] = bucket
          order[#order + 1] = key
        elseif run_at < bucket[2] then
          bucket[2], bucket[3] = run_at, us
        end
        local members, size = bucket[1], bucket[4]
        members[size + 1] = us
        members[size + 2] = id
        bucket[4] = size + 2
        delayed = delayed + 1
      end
    end
  end
end
local wake = must_wake(KEYS[4], soonest < math.huge and comes_first(soonest, KEYS[6], KEYS[2]))
-- Every key written below is read first (see scheduling.lua), except the buckets: each
-- is written with pcall, before anything else, and one of the wrong type takes the
-- members just added out of the buckets written before it (they were not there: their
-- ids are not live, see the caveat below) and fails the call with nothing written.
-- Reading each bucket first would cost a command per bucket, about 8% of the server
-- time of a batch into a large queue, where a batch meets nearly a bucket per task.
-- Caveat: an id already in a bucket without an envelope (an orphan, itself damage) that
-- is scheduled again in the same call as a bucket of the wrong type loses that entry.
if #filed > 0 then
  probe_file_now(KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15],
    KEYS[4], KEYS[3], KEYS[16])
end
if #late > 0 and #order > 0 then
  probe_zsets(KEYS[2])
end
if #due > 0 and #order + #late > 0 then
  probe_lists(KEYS[3])
end
local earliest = {}  -- µs, name, ... of each bucket written, for the index
for n, key in ipairs(order) do
  local bucket = buckets[key]
  local added = redis.pcall('ZADD', KEYS[key], unpack(bucket[1]))
  if type(added) == 'table' then
    for m = 1, n - 1 do
      local members, ids = buckets[order[m]][1], {}
      for i = 2, #members, 2 do
        ids[#ids + 1] = members[i]
      end
      redis.call('ZREM', KEYS[order[m]], unpack(ids))
    end
    return added
  end
  earliest[#earliest + 1] = bucket[3]
  earliest[#earliest + 1] = string.sub(KEYS[key], #KEYS[6] + 2)
end
if #earliest > 0 then
  -- LT: a bucket's score only ever moves earlier here (a new bucket is added).
  redis.call('ZADD', KEYS[6], 'LT', unpack(earliest))
end
if #late > 0 then
  redis.call('ZADD', KEYS[2], unpack(late))
end
if #due > 0 then
  redis.call('RPUSH', KEYS[3], unpack(due))
end
if written > 0 then
  redis.call('HSET', KEYS[1], unpack(fields))
end
if #records > 0 then
  enter_flow(KEYS[8], KEYS[9], records[1], records[2], now)
  if #records > 2 then
    redis.call('HSET', KEYS[9], unpack(records, 3))
  end
end
if #filed > 0 then
  -- Under flow control tasks due now join the due set in this call, as plain ones join
  -- ready: a worker can start them (within their limits) with no dispatcher pass.
  file_now(KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15],
    KEYS[4], KEYS[3], KEYS[16], filed, filed_run_ats, now)
end
local generation = count_delayed(asked, delayed, layout, KEYS[7], KEYS[6])
if wake then
  redis.call('RPUSH', KEYS[4], 1)
end
count_scheduled(KEYS[5], written)
return {generation, #ids, refused}
