-- declare_cron: create or update cron job definitions; unchanged definitions are left alone.
-- KEYS[1] cron       HASH  job name -> definition
-- KEYS[2] cron_next  ZSET  job name -> when its next tick is due (ms); a paused job is absent
-- KEYS[3] wake       LIST
-- KEYS[4] cron_state HASH  job name -> "<runs>|<failures in a row>|<ended>|<run to judge>"
-- KEYS[5] cron_last  HASH  job name -> task id of its latest fired tick
-- KEYS[6] cron_fired HASH  job name -> the spans of ticks its schedule enqueued
--         (fired_spans.lua): a changed job that starts again from its first tick after
--         now closes its open span
-- ARGV triples, one per job: job name, definition, the due time of its first tick after
--   now (ms), used when the job is new or changed
-- Returns: per job, 0 unchanged, 1 created, 2 updated (a paused job stays paused; one
-- that ended, its end passed or its runs done, starts again from its first tick).
-- @include probes
-- @include wake
-- @include fired_spans
-- What is written below is read here first (probes.lua).
probe_hashes(KEYS[1], KEYS[4], KEYS[5], KEYS[6])
local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
probe_lists(KEYS[3])
local outcomes, earliest = {}, nil

local function ended(name)
  local state = redis.call('HGET', KEYS[4], name)
  if not state then
    return false
  end
  local runs, failures, flag, judge = string.match(state, '^(%d+)|(%d+)|(%d)|(.*)$')
  if flag ~= '1' then
    return false
  end
  redis.call('HSET', KEYS[4], name, runs .. '|' .. failures .. '|0|' .. judge)
  return true
end

for i = 1, #ARGV, 3 do
  local name, first = ARGV[i], tonumber(ARGV[i + 2])
  local current = redis.call('HGET', KEYS[1], name)
  if current == ARGV[i + 1] then
    outcomes[#outcomes + 1] = 0
  else
    redis.call('HSET', KEYS[1], name, ARGV[i + 1])
    outcomes[#outcomes + 1] = current and 2 or 1
    if not current or redis.call('ZSCORE', KEYS[2], name) or ended(name) then
      redis.call('ZADD', KEYS[2], first, name)
      if current then
        close_fired(KEYS[6], KEYS[5], name)
      end
      if not earliest or first < earliest then
        earliest = first
      end
    end
  end
end
if earliest then
  wake_if(KEYS[3], comes_before(earliest, head))
end
return outcomes
