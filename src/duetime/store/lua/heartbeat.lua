-- heartbeat: mark a worker alive and renew the leases of the attempts it is running.
-- KEYS[1] workers    ZSET  worker id -> last heartbeat (ms)
-- KEYS[2] leases     ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[3] attempts   HASH  task id -> attempts started
-- KEYS[4] active     LIST  the worker's processing list
-- ARGV[1] now (ms)
-- ARGV[2] new lease deadline (ms)
-- ARGV[3] worker id
-- ARGV[4..] pairs: task id, attempt
-- Returns: {1 if the worker was still registered else 0, {lost task ids}, {ids in the
-- processing list}}; a lost id's lease had expired or its attempt was superseded, so that
-- attempt is fenced. The list lets the worker find ids whose BLMOVE reply it never got.
local now = tonumber(ARGV[1])
local worker = ARGV[3]
local known = redis.call('ZSCORE', KEYS[1], worker) and 1 or 0
redis.call('ZADD', KEYS[1], now, worker)
local lost = {}
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  local member = worker .. '|' .. id
  local deadline = redis.call('ZSCORE', KEYS[2], member)
  if deadline and tonumber(deadline) > now and redis.call('HGET', KEYS[3], id) == ARGV[i + 1] then
    redis.call('ZADD', KEYS[2], 'XX', ARGV[2], member)
  else
    lost[#lost + 1] = id
  end
end
return {known, lost, redis.call('LRANGE', KEYS[4], 0, -1)}
