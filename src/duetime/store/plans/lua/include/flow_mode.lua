-- How scheduling meets flow control (limits_key, records_key): its mode, a task's record.
-- Flow control is flow.lua's. A task with a priority, a cost or a limit key comes with a
-- record and puts its queue under flow control; there, a task due now does not go to
-- ready: schedule_task, schedule_tasks and the keyed scripts file it among the due
-- themselves (file_now, flow_schedule.lua); the other callers (a cron tick, a reschedule
-- to a time past) put it in scheduled for a dispatcher to file by rank and group.
-- @include probes

-- Whether the queue is under flow control, or is put under it by a task with a record
-- (``recorded``). Both hashes are read here, before a script's first write (one of the
-- wrong type then fails the call with nothing written).
local function flow_mode(limits_key, records_key, recorded)
  if recorded then
    probe_hashes(records_key, limits_key)
  end
  return recorded or redis.call('EXISTS', limits_key) == 1
end

-- Write a new task's flow record (``record``, '' for none); the first one puts the queue
-- under flow control ("since" in its limits hash: when).
local function enter_flow(limits_key, records_key, id, record, now)
  if record ~= '' then
    redis.call('HSET', records_key, id, record)
    if redis.call('EXISTS', limits_key) == 0 then
      redis.call('HSET', limits_key, 'since', now)
    end
  end
end
