-- What the schedule scripts share (scheduled_key, stats_key, index_key, layout_key).
-- The scripts are schedule_tasks and schedule_task; index_key is delayed, the index of
-- buckets. A script that fails half way keeps the writes it made: every key these scripts
-- write is read (a read of the wrong type fails too) before their first write, or is that
-- first write, so a key of the wrong type fails the call with nothing written.
-- @include generation
-- @include wake

-- Once the buckets in use hold more than GROW_AT tasks each on average, the next
-- generation (twice as many buckets) opens; older buckets drain as tasks come due.
local GROW_AT = 16

-- Whether a new task due at ``soonest`` (ms) comes before every waiting one, in the
-- buckets and among the retries: only a new earliest task changes how long a dispatcher
-- should sleep (the retries' head is read only when it could).
-- A new task that comes first must wake a sleeping dispatcher (must_wake, wake.lua),
-- asked before a script's first write.
local function comes_first(soonest, index_key, scheduled_key)
  local head = redis.call('ZRANGE', index_key, 0, 0, 'WITHSCORES')
  if head[2] and soonest * 1000 >= tonumber(head[2]) then
    return false
  end
  return comes_before(soonest, redis.call('ZRANGE', scheduled_key, 0, 0, 'WITHSCORES'))
end

-- The layout hash's generation and count, read before a script's first write (a layout
-- of the wrong type then fails the call with nothing written), for count_delayed.
local function read_layout(layout_key)
  return redis.call('HMGET', layout_key, 'generation', 'tasks')
end

-- Count ``delayed`` tasks just put in buckets picked in generation ``asked`` (which
-- becomes the generation if it is newer: a client may open one ahead of time for a large
-- batch), and return the generation new tasks go to next. ``layout``: read_layout(), of
-- the layout hash at ``layout_key``; ``index_key``: delayed, the index of buckets.
local function count_delayed(asked, delayed, layout, layout_key, index_key)
  local generation = generation_of(layout[1])
  local opened = asked > generation
  if opened then
    generation = asked
  end
  if delayed == 0 then
    if opened then
      redis.call('HSET', layout_key, 'generation', generation)
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
      and held > GROW_AT * redis.call('ZCARD', index_key) then
    generation = generation + 1
    opened = true
  end
  if opened then
    redis.call('HSET', layout_key, 'tasks', held, 'generation', generation)
  else
    redis.call('HSET', layout_key, 'tasks', held)
  end
  return generation
end

-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
local function count_scheduled(stats_key, written)
  if written > 0 then
    redis.pcall('HINCRBY', stats_key, 'scheduled', written)
  end
end
