-- keyed_status: the key whose record names a task, and that record, in one step.
-- KEYS[1] keyed_tasks    HASH  task id -> the "<mode>:<key>" whose record names it
-- KEYS[2] keyed          HASH  "<mode>:<key>" -> the key's record (keyed.lua)
-- ARGV[1] task id
-- Returns {field, record or false}, or false when no key names the task.
local field = redis.call('HGET', KEYS[1], ARGV[1])
if not field then
  return false
end
return {field, redis.call('HGET', KEYS[2], field) or false}
