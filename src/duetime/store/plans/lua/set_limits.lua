-- set_limits: change a queue's limits (flow.lua), which puts it under flow control, and
-- look at every group with due tasks again: a raised limit lets them start at once.
-- KEYS[1] limits        HASH  flow control (flow.lua: config_key)
-- KEYS[2] flow records  HASH  task id -> priority, cost, rank, group (flow.lua)
-- KEYS[3] due           ZSET  due tasks by group and rank
-- KEYS[4] turns         ZSET  group -> its turn
-- KEYS[5] throttled     ZSET  group -> when its rate limit lets it start (ms)
-- KEYS[6] rate state    ZSET  group -> theoretical arrival time (ms)
-- KEYS[7] running       ZSET  "<group>\0<lease member>" of started tasks
-- KEYS[8] leases        ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[9] wake          LIST  the dispatchers' alarm
-- KEYS[10] ready        LIST
-- ARGV[1] now (ms)
-- ARGV[2] 'replace': the limits become those given (every other one is dropped);
--         'queue': likewise, but the limits of named keys ("concurrency:<key>",
--         "rate:<key>") are kept; 'update': those given are set (an empty value drops
--         the field), others kept
-- ARGV[3..] field, value pairs
-- Returns: how many groups with due tasks were given a turn.
-- Groups are found by walking the due set group by group (one range read each), at most
-- MOST_GROUPS per call; past that, the rest get their turn back as their tasks end.
-- @include probes
-- @include chunks
-- @include flow
-- @include flow_turns
-- @include flow_pick
local MOST_GROUPS = 10000
local now, mode = tonumber(ARGV[1]), ARGV[2]
probe_hashes(KEYS[1])
probe_lists(KEYS[9], KEYS[10])
probe_flow(KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7])
if mode == 'replace' or mode == 'queue' then
  local names = redis.call('HKEYS', KEYS[1])
  local dropped = {}
  for _, name in ipairs(names) do
    local own = string.find(name, ':', 1, true)
    if name ~= 'since' and (mode == 'replace' or not own) then
      dropped[#dropped + 1] = name
    end
  end
  in_chunks(dropped, function(first, last)
    redis.call('HDEL', KEYS[1], unpack(dropped, first, last))
  end)
end
for i = 3, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
if redis.call('HEXISTS', KEYS[1], 'since') == 0 then
  redis.call('HSET', KEYS[1], 'since', now)
end
redis.call('DEL', KEYS[5])
local given, low = 0, '-'
for _ = 1, MOST_GROUPS do
  local member = redis.call('ZRANGE', KEYS[3], low, '+', 'BYLEX', 'LIMIT', 0, 1)[1]
  if not member then
    break
  end
  local group = string.sub(member, 1, string.find(member, '\0', 1, true) - 1)
  if not redis.call('ZSCORE', KEYS[4], group) then
    give_turn(KEYS[4], KEYS[5], group)
    given = given + 1
  end
  low = group_high(group)
end
feed(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10],
  now)
return given
