-- Until when limits held each task a call starts, noted in holds_key for its lateness.
-- Keys as flow.lua has them.
-- @include flow

-- Until when limits held each task this call started (task id -> ms; none: not held),
-- for its lateness to count from then rather than from when it was due (metrics.md):
-- the time its rate (or the queue's) allowed it, or what holds_key says (note_holds).
local held_until = {}
-- The group of each task this call started, and what pick_many found of each group it
-- looked at ({why it stopped, whether it started any, whether none is left due}) and of
-- the queue: what note_holds reads.
local started_group, looked, queue_look = {}, {}, {}

-- The holds noted in holds_key, per group ("\0" the queue): when its latest hold ended,
-- for a rate's wait or a snooze of the whole key (noted by the dispatcher as it gives
-- the turn back: the wait's end, not its own pass); or SLOT while the group (the queue,
-- at its cap) runs all it may with tasks due: its next start waited for a slot, until
-- that start. A group's note is dropped when it has no due task left.
local SLOT = 'slot'

-- The later of two times, either of which may be false.
local function later(a, b)
  if not a or (b and b > a) then
    return b
  end
  return a
end

-- Until when a note (false for none) held a task that starts ``now``, or false.
local function held_by(note, now)
  if note == SLOT then
    return now
  end
  local at = tonumber(note)
  return at and math.min(at, now) or false
end

-- After this call's picks (pick_many, feed): complete held_until of the tasks it started
-- with the notes of holds_key (as they were before the call), then keep the notes: a
-- group (the queue, at its cap) refused for a slot is noted SLOT; after a start, a group
-- with no due task left loses its note, and a SLOT note whose group (or queue) had room
-- again is dropped, its hold over. A script without the key leaves them as they are.
local function note_holds(holds_key, now)
  local groups = {}
  for group in pairs(looked) do
    groups[#groups + 1] = group
  end
  if #groups == 0 then
    return
  end
  local notes = redis.call('HMGET', holds_key, QUEUE_GROUP, unpack(groups))
  local queue_note, note_of = notes[1] or false, {}
  for n, group in ipairs(groups) do
    note_of[group] = notes[n + 1] or false
  end
  for id, group in pairs(started_group) do
    held_until[id] = later(held_until[id], later(held_by(note_of[group], now),
      held_by(queue_note, now)))
  end
  local slots, gone = {}, {}
  for group, look in pairs(looked) do
    local why, started, drained = look[1], look[2], look[3]
    if why == 'busy' then
      slots[#slots + 1] = group
      slots[#slots + 1] = SLOT
    elseif started and note_of[group] and (drained or note_of[group] == SLOT) then
      gone[#gone + 1] = group
    end
  end
  if queue_look.capped then
    slots[#slots + 1] = QUEUE_GROUP
    slots[#slots + 1] = SLOT
  elseif queue_look.started and queue_note == SLOT
      and (not queue_look.room or queue_look.room > 0) then
    gone[#gone + 1] = QUEUE_GROUP
  end
  if #slots > 0 then
    redis.call('HSET', holds_key, unpack(slots))
  end
  if #gone > 0 then
    redis.call('HDEL', holds_key, unpack(gone))
  end
  started_group, looked, queue_look = {}, {}, {}
end
