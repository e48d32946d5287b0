-- A running task's cancel, asked in cancelling_key; its end forgets the task's records.
-- Keys as parameters. cancel_task.lua cannot take a task from under its attempt: it
-- marks the id in the cancelling hash (task id -> when the cancel was asked, ms), the
-- heartbeat tells the worker, and the worker stops the handler. Whichever step then ends
-- that attempt (ack, fail, snooze, a hand-back, a lease or a worker reaped) ends the task
-- as cancelled instead: its records go, the mark with them, it is counted as cancelled
-- and recorded so in the history (unfinished.lua, for a leased attempt). So once a cancel
-- has said yes, the task never completes, is never retried and never goes to dead.
-- @include chunks

-- The ids among ``ids`` whose cancel was asked, as a set. One EXISTS when no cancel is
-- pending (the usual case: an ack pays one command per batch).
local function cancels_asked(cancelling_key, ids)
  local asked = {}
  if #ids == 0 or redis.call('EXISTS', cancelling_key) == 0 then
    return asked
  end
  in_chunks(ids, function(first, last)
    local marks = redis.call('HMGET', cancelling_key, unpack(ids, first, last))
    for n = first, last do
      if marks[n - first + 1] then
        asked[ids[n]] = true
      end
    end
  end)
  return asked
end

-- The ids of ``ids`` that are (or are not, with ``wanted`` false) in the set ``asked``.
local function split_cancelled(ids, asked, wanted)
  local out = {}
  for _, id in ipairs(ids) do
    if (asked[id] or false) == wanted then
      out[#out + 1] = id
    end
  end
  return out
end

-- Forget the records of tasks ended as cancelled (or expired: ``counter`` names the stats
-- counter, 'cancelled' when not given), their marks too, and count them. Where they were
-- (a list, a lease, a flow slot) is the caller's to clear.
local function forget_cancelled(cancelling_key, tasks_key, attempts_key, errors_key, early_key,
                                stats_key, ids, counter)
  if #ids == 0 then
    return
  end
  in_chunks(ids, function(first, last)
    redis.call('HDEL', cancelling_key, unpack(ids, first, last))
    redis.call('HDEL', tasks_key, unpack(ids, first, last))
    redis.call('HDEL', attempts_key, unpack(ids, first, last))
    redis.call('HDEL', errors_key, unpack(ids, first, last))
    redis.pcall('HDEL', early_key, unpack(ids, first, last)) -- a damaged note key is left
  end)
  redis.pcall('HINCRBY', stats_key, counter or 'cancelled', #ids)
end

-- The result record of a task that ended unfinished, as codec.decode_result reads it: not
-- ok, its value and sixth field how it ended ('cancelled' or 'expired'), when it started
-- unknown (0).
local function ended_result(now, attempt, how)
  return cmsgpack.pack({false, how, 0, now, tonumber(attempt) or 0, how})
end
