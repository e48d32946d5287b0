-- reap_worker: take back every task of a worker that stopped heartbeating (or of a
-- processing list whose worker is not registered at all) and forget the worker.
-- KEYS[1] workers    ZSET  worker id -> last heartbeat (ms)
-- KEYS[2] active     LIST  that worker's processing list
-- KEYS[3] leases     ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[4] scheduled  ZSET
-- KEYS[5] wake       LIST
-- KEYS[6] stats      HASH
-- ARGV[1] now (ms)
-- ARGV[2] worker id
-- ARGV[3] stale before (ms): the worker is reaped only if its last heartbeat is older
-- Returns: number of tasks re-entered, or -1 if the worker heartbeated meanwhile.
local now = tonumber(ARGV[1])
local worker = ARGV[2]
local beat = redis.call('ZSCORE', KEYS[1], worker)
if beat and tonumber(beat) > tonumber(ARGV[3]) then
  return -1
end
local ids = redis.call('LRANGE', KEYS[2], 0, -1)
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[3], worker .. '|' .. id)
  redis.call('ZADD', KEYS[4], now, id)
end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[1], worker)
if #ids > 0 then
  if redis.call('LLEN', KEYS[5]) == 0 then
    redis.call('RPUSH', KEYS[5], 1)
  end
  redis.call('HINCRBY', KEYS[6], 'reaped_tasks', #ids)
end
redis.call('HINCRBY', KEYS[6], 'reaped_workers', 1)
return #ids
