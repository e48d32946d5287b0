-- schedule_tasks: store a batch of new tasks; an id that is already live is left untouched.
-- KEYS[1] tasks      HASH  task id -> envelope
-- KEYS[2] scheduled  ZSET  task id -> run-at (ms)
-- KEYS[3] ready      LIST  task ids due now
-- KEYS[4] wake       LIST  one-element signal a sleeping dispatcher blocks on
-- KEYS[5] stats      HASH  counters
-- ARGV[1] now (ms, server clock)
-- ARGV[2] the tasks, msgpack: a flat array of triples task id, run-at (ms), envelope
--         (one argument rather than three per task: clients pack it in one C call,
--         where a command of thousands of arguments costs them per argument)
-- Returns: one integer per task, 1 = created, 0 = the id was already live (nothing changed).
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- One HMGET finds the live ids, then one HSET, one ZADD and one RPUSH write the rest:
-- a command per task costs the server several times more than a command per batch.
-- Clients send at most 1,000 tasks per call, so the unpack()ed lists stay within Lua's
-- stack.
local now = tonumber(ARGV[1])
local tasks = cmsgpack.unpack(ARGV[2])
local ids = {}
for i = 1, #tasks, 3 do
  ids[#ids + 1] = tasks[i]
end
local live = redis.call('HMGET', KEYS[1], unpack(ids))
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local earliest = head[2] and tonumber(head[2]) or math.huge
local wake = false
local created = {}
local taken = {}  -- ids of this batch already given a place: a repeat is live too
local fields, members, due = {}, {}, {}
for n = 1, #ids do
  local id = ids[n]
  if live[n] or taken[id] then
    created[n] = 0
  else
    taken[id] = true
    created[n] = 1
    local run_at = tonumber(tasks[3 * n - 1])
    fields[#fields + 1] = id
    fields[#fields + 1] = tasks[3 * n]
    if run_at <= now then
      due[#due + 1] = id
    else
      members[#members + 1] = run_at
      members[#members + 1] = id
      if run_at < earliest then
        earliest = run_at
        wake = true
      end
    end
  end
end
if #fields > 0 then
  redis.call('HSET', KEYS[1], unpack(fields))
end
if #members > 0 then
  redis.call('ZADD', KEYS[2], unpack(members))
end
if #due > 0 then
  redis.call('RPUSH', KEYS[3], unpack(due))
end
-- Only a new earliest task changes how long a dispatcher should sleep.
if wake and redis.call('LLEN', KEYS[4]) == 0 then
  redis.call('RPUSH', KEYS[4], 1)
end
local count = #fields / 2
if count > 0 then
  redis.pcall('HINCRBY', KEYS[5], 'scheduled', count)
end
return created
