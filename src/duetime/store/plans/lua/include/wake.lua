-- The wake rule: when a change must wake a sleeping dispatcher (wake_key).
-- A dispatcher sleeps until the earliest thing it waits for (a run-at, a lease deadline,
-- a cron tick), blocked on the wake list; a change that puts something before that must
-- wake it. The list holds one element at most: while one waits there the dispatcher wakes
-- anyway, and nothing more is pushed. The wake list's key is given as a parameter
-- (wake_key), as each script has it in its KEYS.

-- Whether something due at ``at`` (ms) comes before ``head``, the first entry of a sorted
-- set as ZRANGE 0 0 WITHSCORES reads it ({member, score in ms}, or {} when it is empty).
local function comes_before(at, head)
  return not head[2] or at < tonumber(head[2])
end

-- Whether a change that puts something before what the dispatcher waits for (``earlier``)
-- must wake it: no wake-up waits in the list. The list is read only then. A script asks
-- before its first write (a wake list of the wrong type then fails the call with nothing
-- written), and pushes the wake-up (RPUSH 1) after its writes.
local function must_wake(wake_key, earlier)
  return earlier and redis.call('LLEN', wake_key) == 0
end

-- Wake the dispatcher if must_wake says so, at once: for a script that read the wake list
-- before its first write already.
local function wake_if(wake_key, earlier)
  if must_wake(wake_key, earlier) then
    redis.call('RPUSH', wake_key, 1)
  end
end
