-- The fence: whether an attempt still holds its lease (leases_key, attempts_key).
-- An attempt may ack, fail or renew its lease only while it holds the lease. Its lease
-- (the member "<worker>|<task id>" in leases) runs past now, and the task's attempt
-- counter is still this attempt (a newer attempt supersedes it). Anything else is fenced:
-- the outcome is dropped (and counted), the lease is not renewed.

-- Whether a lease whose deadline (a score as ZSCORE or ZMSCORE read it, or false when
-- there is no lease) runs past ``now`` (ms).
local function lease_runs(deadline, now)
  return deadline and tonumber(deadline) > now
end

-- Whether the stored attempt counter (text, or false when there is none) is ``attempt``.
-- Lua's == never converts between text and numbers, so an attempt given as text (an ARGV:
-- fail_task, heartbeat) is compared as text, and one given as a number (unpacked from
-- msgpack: ack_tasks) as a number. The two differ only for a counter written by hand in
-- another spelling of the number ("03", "3.0", " 3"): ack_tasks takes it for the
-- attempt, fail_task and heartbeat fence it (each keeps what it always did).
local function is_attempt(stored, attempt)
  return stored == attempt or tonumber(stored) == attempt
end

-- Whether the attempt ``attempt`` of task ``id`` holds its lease ``member``: the lease
-- is read, then the attempt counter only while the lease runs (an attempts key of the
-- wrong type fails only a call that could apply).
local function holds_lease(leases_key, attempts_key, member, id, attempt, now)
  return lease_runs(redis.call('ZSCORE', leases_key, member), now)
    and is_attempt(redis.call('HGET', attempts_key, id), attempt)
end
