-- release_worker: graceful shutdown; hand every task still in the worker's list back
-- to the head of ready (the interrupted attempt does not count) and deregister.
-- KEYS[1] workers    ZSET
-- KEYS[2] active     LIST  the worker's processing list
-- KEYS[3] leases     ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[4] attempts   HASH
-- KEYS[5] ready      LIST
-- KEYS[6] stats      HASH
-- ARGV[1] worker id
-- Returns: number of tasks handed back.
local worker = ARGV[1]
local ids = redis.call('LRANGE', KEYS[2], 0, -1)
-- Walk backwards so LPUSH keeps their order at the head of ready.
for i = #ids, 1, -1 do
  local id = ids[i]
  if redis.call('ZREM', KEYS[3], worker .. '|' .. id) == 1 then
    if redis.call('HINCRBY', KEYS[4], id, -1) <= 0 then
      redis.call('HDEL', KEYS[4], id)
    end
  end
  redis.call('LPUSH', KEYS[5], id)
end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[1], worker)
if #ids > 0 then
  redis.call('HINCRBY', KEYS[6], 'handed_back', #ids)
end
return #ids
