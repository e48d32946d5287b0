-- The rate limits' state (tats_key, GCRA): when a task of some cost may start.
-- tats_key holds GCRA's theoretical arrival time per group ("\0" the queue's), and what a
-- start leaves is written back by the caller.

-- A rate ("<count>|<period ms>|<burst>") as its interval (ms per unit of cost) and burst;
-- nil for none (or anything else).
local function rate_parts(rate)
  local count, period, burst = string.match(rate or '', '^(%d+)|(%d+)|(%d+)$')
  if not count or tonumber(count) == 0 then
    return nil
  end
  return tonumber(period) / tonumber(count), tonumber(burst)
end

-- GCRA: when a task of ``cost`` may start, given the stored theoretical arrival time
-- (``stored``, or nil), and the arrival time its start leaves. Up to burst may start at
-- once, then one per interval. A cost above the burst starts only once the limit is
-- idle. A start that comes less than one interval (or 1 ms, the clock's step, if that is
-- longer) after its time keeps the schedule: a claim comes a moment after a rate lets go,
-- and without it every start would lose that moment (400/s gave 333/s at most, and any
-- burst of 1 at most one start per ms); with it the average is exact, and a span of one
-- period holds at most count + burst. Past 1,000/s (an interval under the clock's 1 ms
-- step), "now" stands for the whole millisecond: starts due within it may go, or a burst
-- of 1 would allow one start per ms; a span then holds 2 ms worth of starts more.
local function gcra(stored, interval, burst, cost, now)
  local tat = stored or now
  if tat < now - math.max(interval, 1) then
    tat = now
  end
  local within = interval < 1 and 0.999 or 0
  return tat - math.max(0, burst - cost) * interval - within, tat + cost * interval
end

-- When a task of ``cost`` may start under ``rate`` (now when there is none), and the
-- arrival time its start leaves (false when there is no rate): gcra() on the stored state.
local function rate_check(tats_key, member, rate, cost, now)
  local interval, burst = rate_parts(rate)
  if not interval then
    return now, false
  end
  return gcra(tonumber(redis.call('ZSCORE', tats_key, member)), interval, burst, cost, now)
end
