-- What schedule_tasks and schedule_task share, on their keys: KEYS[2] scheduled,
-- KEYS[4] wake, KEYS[5] stats, KEYS[6] delayed (the index of buckets), KEYS[7]
-- delayed_layout. Needs generation.lua.
-- A script that fails half way keeps the writes it made: every key these scripts write
-- is read (a read of the wrong type fails too) before their first write, or is that
-- first write, so a key of the wrong type fails the call with nothing written.
-- Once the buckets in use hold more than GROW_AT tasks each on average, the next
-- generation (twice as many buckets) opens; older buckets drain as tasks come due.
local GROW_AT = 16

-- Whether a new task due at ``soonest`` (ms) comes before every waiting one, in the
-- buckets and among the retries: only a new earliest task changes how long a dispatcher
-- should sleep (the retries' head is read only when it could).
local function comes_first(soonest)
  local head = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
  if head[2] and soonest * 1000 >= tonumber(head[2]) then
    return false
  end
  head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  return not head[2] or soonest < tonumber(head[2])
end

-- Whether a new task due at ``soonest`` must wake a sleeping dispatcher: it comes first
-- and the wake list (one element at most) is empty. Asked before a script's first write,
-- so a wake list of the wrong type fails the call with nothing written.
local function must_wake(soonest)
  return comes_first(soonest) and redis.call('LLEN', KEYS[4]) == 0
end

-- The layout hash's generation and count, read before a script's first write (a layout
-- of the wrong type then fails the call with nothing written), for count_delayed.
local function read_layout()
  return redis.call('HMGET', KEYS[7], 'generation', 'tasks')
end

-- Count ``delayed`` tasks just put in buckets picked in generation ``asked`` (which
-- becomes the generation if it is newer: a client may open one ahead of time for a large
-- batch), and return the generation new tasks go to next. ``layout``: read_layout().
local function count_delayed(asked, delayed, layout)
  local generation = generation_of(layout[1])
  local opened = asked > generation
  if opened then
    generation = asked
  end
  if delayed == 0 then
    if opened then
      redis.call('HSET', KEYS[7], 'generation', generation)
    end
    return generation
  end
  -- A count that is not a number (edited by hand) starts again from these tasks.
  local held = (tonumber(layout[2]) or 0) + delayed
  -- Growth follows how full the buckets in use are on average (looked at each time the
  -- count passes a multiple of GROW_AT): a queue that keeps its size keeps its
  -- generation however many tasks pass through it.
  if asked == generation and generation < MOST_GENERATION
      and math.floor(held / GROW_AT) > math.floor((held - delayed) / GROW_AT)
      and held > GROW_AT * redis.call('ZCARD', KEYS[6]) then
    generation = generation + 1
    opened = true
  end
  if opened then
    redis.call('HSET', KEYS[7], 'tasks', held, 'generation', generation)
  else
    redis.call('HSET', KEYS[7], 'tasks', held)
  end
  return generation
end

-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
local function count_scheduled(written)
  if written > 0 then
    redis.pcall('HINCRBY', KEYS[5], 'scheduled', written)
  end
end
