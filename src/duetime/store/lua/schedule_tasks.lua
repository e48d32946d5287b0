-- schedule_tasks: store a batch of new tasks; an id that is already live is left untouched.
-- KEYS[1] tasks      HASH  task id -> envelope
-- KEYS[2] scheduled  ZSET  task id -> run-at (ms)
-- KEYS[3] ready      LIST  task ids due now
-- KEYS[4] wake       LIST  one-element signal a sleeping dispatcher blocks on
-- KEYS[5] stats      HASH  counters
-- ARGV[1] now (ms, server clock)
-- ARGV[2..] triples: task id, run-at (ms), envelope
-- Returns: one integer per task, 1 = created, 0 = the id was already live (nothing changed).
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
local now = tonumber(ARGV[1])
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
local earliest = head[2] and tonumber(head[2]) or math.huge
local wake = false
local created = {}
local count = 0
for i = 2, #ARGV, 3 do
  local id, run_at = ARGV[i], tonumber(ARGV[i + 1])
  if redis.call('HSETNX', KEYS[1], id, ARGV[i + 2]) == 1 then
    if run_at <= now then
      redis.call('RPUSH', KEYS[3], id)
    else
      redis.call('ZADD', KEYS[2], run_at, id)
      if run_at < earliest then
        earliest = run_at
        wake = true
      end
    end
    count = count + 1
    created[#created + 1] = 1
  else
    created[#created + 1] = 0
  end
end
-- Only a new earliest task changes how long a dispatcher should sleep.
if wake and redis.call('LLEN', KEYS[4]) == 0 then
  redis.call('RPUSH', KEYS[4], 1)
end
if count > 0 then
  redis.pcall('HINCRBY', KEYS[5], 'scheduled', count)
end
return created
