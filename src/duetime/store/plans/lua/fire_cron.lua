-- fire_cron: for each of some cron jobs, enqueue its due ticks and advance its next tick,
-- once, however many dispatchers try: each job's next tick is compared and set (CAS), and
-- tick task ids are deterministic, so a tick is never enqueued twice.
-- KEYS[1] cron_next  ZSET  job name -> when its next tick is due (ms: the tick + jitter)
-- KEYS[2] cron_last  HASH  job name -> task id of the latest fired tick
-- KEYS[3] cron_held  HASH  job name -> a tick held back (overlap = delay)
-- KEYS[4] tasks      HASH
-- KEYS[5] ready      LIST
-- KEYS[6] stats      HASH
-- KEYS[7] limits     HASH  flow control (flow_mode.lua): while it exists, or when a tick
--         has a flow record, ticks go to scheduled (a dispatcher files them by rank and
--         limit key) rather than ready
-- KEYS[8] flow records HASH  task id -> "<priority>|<cost>||<limit key>"
-- KEYS[9] scheduled  ZSET
-- KEYS[10] wake      LIST  rung when ticks go to scheduled, so a dispatcher files them
-- KEYS[11] cron_state HASH  job name -> "<runs>|<failures in a row>|<ended>|<run to judge>"
--          for jobs with max_runs or pause_after_failures, and jobs that ended
-- KEYS[12] dead      ZSET  task id -> time of death: a run that is there failed
-- KEYS[13] cron_fired HASH job name -> the spans of ticks its schedule enqueued
--          (fired_spans.lua), which backfills do not run again
-- ARGV[1] the jobs, packed (msgpack): an array of arrays, one per job, of
--   name, the next-tick score the caller read (CAS), the following score (-1: the job
--   never fires again), overlap policy (allow | skip | delay), when delaying the time to
--   look again and the tick to hold, ticks skipped outside the catch-up window (counted),
--   max runs (0: none), failed runs in a row that pause it (0: none), '1' when the first
--   tick to enqueue is the first the job had not fired (none was skipped or dropped
--   before it) else '0', and then the ticks to enqueue (all due) as quads: task id
--   (cron:<name>:<tick>), run-at (ms), envelope, flow record ('').
-- Returns: an array, per job, of the number of ticks enqueued, or 'stale' (another
-- dispatcher fired it, or the job changed), 'skipped' or 'delayed' (the previous run is
-- still live), 'paused' (its runs failed pause_after_failures times in a row).
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- @include probes
-- @include flow_mode
-- @include fired_spans
-- What is written below is read here first (probes.lua).
probe_hashes(KEYS[2], KEYS[3], KEYS[4], KEYS[11], KEYS[13])
probe_lists(KEYS[5], KEYS[10])
probe_zsets(KEYS[9], KEYS[12])
local woken = false
-- Counters are bumped once per call, not per job.
local fired, outside_window, skipped, paused = 0, 0, 0, 0

local function read_state(name)
  local raw = redis.call('HGET', KEYS[11], name)
  local runs, failures, ended, judge = string.match(raw or '', '^(%d+)|(%d+)|(%d)|(.*)$')
  return {runs = tonumber(runs) or 0, failures = tonumber(failures) or 0,
    ended = ended == '1', judge = judge or ''}
end

local function write_state(name, state)
  redis.call('HSET', KEYS[11], name,
    state.runs .. '|' .. state.failures .. '|' .. (state.ended and '1' or '0') .. '|' .. state.judge)
end

-- The run waiting to be judged, once it has ended: dead is a failure, gone a success.
local function judge_run(state)
  if state.judge == '' then
    return
  end
  if redis.call('HEXISTS', KEYS[4], state.judge) == 1 then
    if redis.call('ZSCORE', KEYS[12], state.judge) then
      state.failures = state.failures + 1
      state.judge = ''
    end
  else
    state.failures = 0
    state.judge = ''
  end
end

local function stop(name)
  redis.call('ZREM', KEYS[1], name)
  redis.call('HDEL', KEYS[3], name)
end

-- Writes of every job alike are gathered and made once a call, a command for many jobs
-- (a call fires up to hundreds): the next scores, the last tick ids, the fired spans,
-- the held ticks let go, the ticks pushed to ready, in the jobs' order.
local next_scores, last_ids, fired_spans, unheld, pushed = {}, {}, {}, {}, {}
local function in_chunks(values, write)
  for first = 1, #values, 1000 do  -- an even count: pairs stay whole
    write(unpack(values, first, math.min(first + 999, #values)))
  end
end

local function advance(name, following)
  if tonumber(following) >= 0 then
    next_scores[#next_scores + 1] = following
    next_scores[#next_scores + 1] = name
    unheld[#unheld + 1] = name
    return false
  end
  stop(name)
  return true
end

local seen = {}
local under_flow = redis.call('EXISTS', KEYS[7]) == 1

local function fire(job)
  local name, max_runs, pause_after = job[1], tonumber(job[8]), tonumber(job[9])
  local score = redis.call('ZSCORE', KEYS[1], name)
  -- A job named twice in one call is fired once: its score is written at the end.
  if not score or tonumber(score) ~= tonumber(job[2]) or seen[name] then
    return 'stale'
  end
  seen[name] = true
  local keeps = max_runs > 0 or pause_after > 0
  local state = keeps and read_state(name) or {runs = 0, failures = 0, ended = false, judge = ''}
  if pause_after > 0 then
    judge_run(state)
    if state.failures >= pause_after then
      stop(name)
      write_state(name, state)
      paused = paused + 1
      return 'paused'
    end
  end
  outside_window = outside_window + tonumber(job[7])
  if job[4] ~= 'allow' and #job >= 11 then
    local last = redis.call('HGET', KEYS[2], name)
    if last and redis.call('HEXISTS', KEYS[4], last) == 1 then
      if keeps then
        write_state(name, state)
      end
      if job[4] == 'delay' then
        redis.call('ZADD', KEYS[1], job[5], name)
        redis.call('HSET', KEYS[3], name, job[6])
        return 'delayed'
      end
      state.ended = advance(name, job[3])
      if state.ended then
        write_state(name, state)
      end
      close_fired(KEYS[13], KEYS[2], name)  -- a tick skipped: the run of fired ticks ends
      skipped = skipped + 1
      return 'skipped'
    end
  end
  local count = 0
  local recorded = #job >= 11 and job[14] ~= ''
  local flowing = under_flow or (recorded and flow_mode(KEYS[7], KEYS[8], true))
  local last
  for i = 11, #job, 4 do
    if max_runs > 0 and state.runs >= max_runs then
      break
    end
    if redis.call('HSETNX', KEYS[4], job[i], job[i + 2]) == 1 then
      if flowing then
        enter_flow(KEYS[7], KEYS[8], job[i], job[i + 3], job[i + 1])
        under_flow = under_flow or recorded
        redis.call('ZADD', KEYS[9], job[i + 1], job[i])
        woken = true
      else
        pushed[#pushed + 1] = job[i]
      end
      count = count + 1
      state.runs = state.runs + 1
      if pause_after > 0 and state.judge == '' then
        state.judge = job[i]
      end
    end
    last = job[i]
  end
  if last then
    last_ids[#last_ids + 1] = name
    last_ids[#last_ids + 1] = last
    -- Its ticks are in its open span (which ends at cron_last) when they go on from the
    -- one before; if not, that span is closed and one opened from them. (A record that
    -- starts with a digit has an open span: the common case reads no more.)
    local raw = job[10] == '1' and redis.call('HGET', KEYS[13], name)
    if not (raw and string.find(raw, '^%d')) then
      local open, closed = read_fired(KEYS[13], name)
      if job[10] ~= '1' then
        closed = closed_spans(open, closed, redis.call('HGET', KEYS[2], name))
      end
      fired_spans[#fired_spans + 1] = name
      fired_spans[#fired_spans + 1] = string.match(job[11], ':(%d+)$') .. '|' .. closed
    end
  elseif job[10] ~= '1' then
    close_fired(KEYS[13], KEYS[2], name)  -- every due tick dropped (the catch-up window)
  end
  if max_runs > 0 and state.runs >= max_runs then
    stop(name)
    state.ended = true
  else
    state.ended = advance(name, job[3])
  end
  if keeps or state.ended then
    write_state(name, state)
  end
  fired = fired + count
  return count
end

local outcomes = {}
for index, job in ipairs(cmsgpack.unpack(ARGV[1])) do
  outcomes[index] = fire(job)
end
in_chunks(pushed, function(...) redis.call('RPUSH', KEYS[5], ...) end)
in_chunks(last_ids, function(...) redis.call('HSET', KEYS[2], ...) end)
in_chunks(fired_spans, function(...) redis.call('HSET', KEYS[13], ...) end)
in_chunks(next_scores, function(...) redis.call('ZADD', KEYS[1], ...) end)
in_chunks(unheld, function(...) redis.call('HDEL', KEYS[3], ...) end)
if woken and redis.call('LLEN', KEYS[10]) == 0 then
  redis.call('RPUSH', KEYS[10], 1)
end
if fired > 0 then
  redis.pcall('HINCRBY', KEYS[6], 'cron_fired', fired)
  redis.pcall('HINCRBY', KEYS[6], 'scheduled', fired)
end
if skipped > 0 then
  redis.pcall('HINCRBY', KEYS[6], 'cron_skipped', skipped)
end
if outside_window > 0 then
  redis.pcall('HINCRBY', KEYS[6], 'cron_skipped_outside_window', outside_window)
end
if paused > 0 then
  redis.pcall('HINCRBY', KEYS[6], 'cron_paused_after_failures', paused)
end
return outcomes
