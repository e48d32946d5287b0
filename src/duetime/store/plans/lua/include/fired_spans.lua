-- The spans of ticks a cron job's schedule enqueued: fired_key, read with last_key.
-- Backfills do not run those ticks again. A record (in cron_fired) is
-- "<open low>|<closed spans>", the closed ones "low:high,..." (ms, newest first). The
-- open span, when <open low> is not empty, runs from it to the tick of the job's
-- cron_last (its latest fired tick, "cron:<name>:<tick>"), so that a firing that goes on
-- from the tick before it writes nothing here (cron_last it writes anyway). What breaks
-- the run of the schedule's ticks closes the open span at that tick: a tick skipped or
-- dropped (overlap, the catch-up window, the missed policy), a pause, a resume or
-- declaration that moves the next tick, a backfill that writes cron_last.

-- Most spans a job keeps: past it, the two spans with the narrowest gap between them
-- (the oldest of those) are made one, so the gap's ticks then count as run (a backfill
-- does not run them, rather than run again those an older span held were it dropped).
local MOST_FIRED_SPANS = 16

-- The closed spans ("low:high,...", newest first) with their narrowest gap closed.
local function narrowed_spans(spans)
  local found = {}
  for low, high in string.gmatch(spans, '(%d+):(%d+)') do
    found[#found + 1] = {low, high}
  end
  local at, narrowest = 1, nil
  for i = 1, #found - 1 do
    local gap = tonumber(found[i][1]) - tonumber(found[i + 1][2])
    if not narrowest or gap <= narrowest then  -- the oldest of the narrowest: recent gaps stay
      at, narrowest = i, gap
    end
  end
  found[at + 1][2] = found[at][2]
  table.remove(found, at)
  local parts = {}
  for i, span in ipairs(found) do
    parts[i] = span[1] .. ':' .. span[2]
  end
  return table.concat(parts, ',')
end

-- A job's record as read: its open span's low ('' none) and its closed spans.
local function read_fired(fired_key, name)
  local open, closed = string.match(redis.call('HGET', fired_key, name) or '', '^(%d*)|([%d:,]*)$')
  return open or '', closed or ''  -- none, or not a record these scripts write: afresh
end

-- The closed spans with the open one (from ``open``, '' none) closed at the tick of
-- ``last_id`` (the job's cron_last before it is written again), and kept within the bound
-- with the open span that may follow.
local function closed_spans(open, closed, last_id)
  if open == '' then
    return closed
  end
  local high = string.match(last_id or '', ':(%d+)$')
  if not high or tonumber(high) < tonumber(open) then
    high = open
  end
  closed = closed == '' and (open .. ':' .. high) or (open .. ':' .. high .. ',' .. closed)
  if select(2, string.gsub(closed, ',', '')) >= MOST_FIRED_SPANS - 1 then
    closed = narrowed_spans(closed)
  end
  return closed
end

-- Close a job's open span (a pause, a resume, a declaration or a backfill breaks the run
-- of its schedule's ticks): nothing written when it has none.
local function close_fired(fired_key, last_key, name)
  local open, closed = read_fired(fired_key, name)
  if open ~= '' then
    redis.call('HSET', fired_key, name, '|' .. closed_spans(open, closed, redis.call('HGET', last_key, name)))
  end
end
