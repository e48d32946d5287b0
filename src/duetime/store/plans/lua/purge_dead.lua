-- purge_dead: delete dead tasks for good, chosen by id or by retention.
-- KEYS[1] dead       ZSET  task id -> time of death (ms)
-- KEYS[2] tasks      HASH
-- KEYS[3] attempts   HASH
-- KEYS[4] errors     HASH
-- KEYS[5] flow records HASH  task id -> its flow record (flow_records.lua)
-- ARGV[1] died before (ms): also purge up to ARGV[3] tasks that died before this; -1 = none
-- ARGV[2] keep at most this many dead tasks (oldest purged first, up to ARGV[3]); -1 = no cap
-- ARGV[3] most tasks purged by retention in one call
-- ARGV[4..] task ids to purge explicitly
-- Returns: the ids purged (those named first, in their order; ids not in dead are left
-- alone).
-- @include probes
-- What is written below is read here first (probes.lua).
probe_hashes(KEYS[2], KEYS[3], KEYS[4], KEYS[5])
local ids = {}
for i = 4, #ARGV do
  ids[#ids + 1] = ARGV[i]
end
local limit = tonumber(ARGV[3])
-- The expired ones are the oldest, so the cap counts on from just after them.
local expired = 0
if tonumber(ARGV[1]) >= 0 then
  local old = redis.call('ZRANGE', KEYS[1], '-inf', '(' .. ARGV[1], 'BYSCORE', 'LIMIT', 0, limit)
  for _, id in ipairs(old) do
    ids[#ids + 1] = id
  end
  expired = #old
end
if tonumber(ARGV[2]) >= 0 then
  local over = redis.call('ZCARD', KEYS[1]) - expired - tonumber(ARGV[2])
  if over > 0 then
    local oldest = redis.call('ZRANGE', KEYS[1], expired, expired + math.min(over, limit) - 1)
    for _, id in ipairs(oldest) do
      ids[#ids + 1] = id
    end
  end
end
local purged = {}
for _, id in ipairs(ids) do
  if redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('HDEL', KEYS[5], id)
    purged[#purged + 1] = id
  end
end
return purged
