-- due_cron: the cron jobs whose next tick has come, with what firing them needs (their
-- definitions and held ticks), read in one step so that the names are not sent back.
-- KEYS[1] cron_next  ZSET  job name -> when its next tick is due (ms)
-- KEYS[2] cron       HASH  job name -> definition
-- KEYS[3] cron_held  HASH  job name -> a tick held back (overlap = delay)
-- ARGV[1] now (ms): jobs due at or before it
-- ARGV[2] at most this many jobs (the caller keeps it within Lua's unpack limit)
-- Returns: {names and scores (as ZRANGE WITHSCORES), definitions, held ticks}; the last
-- two in the names' order, nil where there is none.
local due = redis.call('ZRANGE', KEYS[1], '-inf', ARGV[1], 'BYSCORE', 'WITHSCORES', 'LIMIT', 0,
  ARGV[2])
if #due == 0 then
  return {due, {}, {}}
end
local names = {}
for i = 1, #due, 2 do
  names[#names + 1] = due[i]
end
return {due, redis.call('HMGET', KEYS[2], unpack(names)), redis.call('HMGET', KEYS[3], unpack(names))}
