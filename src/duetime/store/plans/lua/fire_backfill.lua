-- fire_backfill: for each of some cron jobs with a backfill due, enqueue the backfill's
-- next tick (at a bounded pace) under the job's overlap policy, and advance it, once
-- however many dispatchers try: the due time and the whole record are compared and set.
-- A tick is never enqueued again: not one within the spans earlier backfills of the job
-- handled (the record keeps them), not one within the spans of ticks the job's own
-- schedule enqueued (cron_fired, read here: a tick fired since the backfill was
-- planned counts too), and not one whose task is live (its task id is the tick's id,
-- stored with HSETNX), whichever firing enqueued it.
-- KEYS[1] cron_backfill_due ZSET job name -> when its backfill fires its next tick (ms)
-- KEYS[2] cron_backfill HASH  job name -> "<from>|<to>|<spacing>|<next tick>|<fired>|<total>
--                             |<skipped>|<ran before>|<covered spans: low:high,...>" (a
--                             record of six fields, from before the spans, has none)
-- KEYS[3] cron_last  HASH  job name -> task id of its latest fired tick
-- KEYS[4] tasks      HASH
-- KEYS[5] ready      LIST
-- KEYS[6] stats      HASH
-- KEYS[7] limits     HASH  flow control (flow_mode.lua), as in fire_cron
-- KEYS[8] flow records HASH
-- KEYS[9] scheduled  ZSET
-- KEYS[10] wake      LIST
-- KEYS[11] cron_fired HASH job name -> the spans of ticks the job's schedule enqueued
--          (fired_spans.lua): its open span is closed here before cron_last is written
-- ARGV[1] the backfills, packed (msgpack): an array of arrays, one per job, of name, the
--   due time the caller read (CAS), the record it read (CAS), the next tick to fire
--   after this one, not within the covered spans (-1: the range is done), when it
--   fires, overlap policy (allow | skip | delay), when delaying the time to look again,
--   and the tick's task id, run-at (ms), envelope and flow record ('').
-- Returns: an array, per job, of 1 enqueued, 0 it had run already (an earlier backfill
-- handled it, the job's schedule enqueued it, or its task is live), or 'stale',
-- 'skipped' or 'delayed' (the job's previous run is still live).
-- @include probes
-- @include flow_mode
-- @include fired_spans
-- What is written below is read here first (probes.lua).
probe_hashes(KEYS[2], KEYS[3], KEYS[4], KEYS[11])
probe_lists(KEYS[5], KEYS[10])
probe_zsets(KEYS[9])
local woken = false

-- Whether ``tick`` lies within one of the covered spans ("low:high,low:high").
local function covered(spans, tick)
  for low, high in string.gmatch(spans, '(%d+):(%d+)') do
    if tick >= tonumber(low) and tick <= tonumber(high) then
      return true
    end
  end
  return false
end

local function fire(job)
  local name = job[1]
  local score = redis.call('ZSCORE', KEYS[1], name)
  local record = redis.call('HGET', KEYS[2], name)
  if not score or tonumber(score) ~= tonumber(job[2]) or record ~= job[3] then
    return 'stale'
  end
  local range, tick, fired, total, rest = string.match(record, '^(%d+|%d+|%d+)|(%-?%d+)|(%d+)|(%d+)(.*)$')
  local skipped, before, spans = '0', '0', ''
  if rest ~= '' then
    skipped, before, spans = string.match(rest, '^|(%d+)|(%d+)|([%d:,]*)$')
  end
  if not range or not skipped or tonumber(tick) < 0 then
    return 'stale'  -- not a record this script writes: the caller drops such records
  end
  local function advance(enqueued, passed, ran)
    redis.call('HSET', KEYS[2], name, range .. '|' .. job[4] .. '|' .. (tonumber(fired) + enqueued)
      .. '|' .. total .. '|' .. (tonumber(skipped) + passed) .. '|' .. (tonumber(before) + ran)
      .. '|' .. spans)
    if tonumber(job[4]) >= 0 then
      redis.call('ZADD', KEYS[1], job[5], name)
    else
      redis.call('ZREM', KEYS[1], name)
    end
  end
  local last = redis.call('HGET', KEYS[3], name)
  local open, closed = read_fired(KEYS[11], name)
  local fired_by_schedule = covered(closed, tonumber(tick))
  if open ~= '' then  -- from its low to the tick of cron_last
    local high = string.match(last or '', ':(%d+)$') or open
    fired_by_schedule = fired_by_schedule or covered(open .. ':' .. high, tonumber(tick))
  end
  if covered(spans, tonumber(tick)) or fired_by_schedule then
    advance(0, 0, 1)
    return 0
  end
  if job[6] ~= 'allow' then
    if last and last ~= job[8] and redis.call('HEXISTS', KEYS[4], last) == 1 then
      if job[6] == 'delay' then
        redis.call('ZADD', KEYS[1], job[7], name)
        return 'delayed'
      end
      advance(0, 1, 0)
      redis.pcall('HINCRBY', KEYS[6], 'cron_skipped', 1)
      return 'skipped'
    end
  end
  local count = 0
  if redis.call('HSETNX', KEYS[4], job[8], job[10]) == 1 then
    if flow_mode(KEYS[7], KEYS[8], job[11] ~= '') then
      enter_flow(KEYS[7], KEYS[8], job[8], job[11], job[9])
      redis.call('ZADD', KEYS[9], job[9], job[8])
      woken = true
    else
      redis.call('RPUSH', KEYS[5], job[8])
    end
    count = 1
    redis.pcall('HINCRBY', KEYS[6], 'cron_backfilled', 1)
    redis.pcall('HINCRBY', KEYS[6], 'scheduled', 1)
  end
  if open ~= '' then  -- its open span ends at cron_last, written now: it is closed
    redis.call('HSET', KEYS[11], name, '|' .. closed_spans(open, closed, last))
  end
  redis.call('HSET', KEYS[3], name, job[8])
  advance(count, 0, 1 - count)
  return count
end

local outcomes = {}
for index, job in ipairs(cmsgpack.unpack(ARGV[1])) do
  outcomes[index] = fire(job)
end
if woken and redis.call('LLEN', KEYS[10]) == 0 then
  redis.call('RPUSH', KEYS[10], 1)
end
return outcomes
