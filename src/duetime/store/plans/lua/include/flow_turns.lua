-- The turns of limit keys (turns_key) and their rate waits (throttled_key, wake_key).
-- A group with a turn may have its due tasks looked at by a claim; one that waits for its
-- rate limit (or a snooze of its whole key) is in throttled instead, until a dispatcher
-- gives its turn back. Keys as flow.lua describes them.
-- @include chunks

-- Give each of ``groups`` a turn after every group that has one, unless it has one or
-- waits for its rate limit: give_turn for many, in a few commands whatever their number.
-- With ``wanted`` (a function of a group), only to those it accepts: it is asked only of
-- the groups without a turn (most keep theirs).
local function give_turns(turns_key, throttled_key, groups, wanted)
  local adds = {}
  local last = false
  in_chunks(groups, function(first, final)
    local having = redis.call('ZMSCORE', turns_key, unpack(groups, first, final))
    local waiting = redis.call('ZMSCORE', throttled_key, unpack(groups, first, final))
    last = last or tonumber(redis.call('ZRANGE', turns_key, -1, -1, 'WITHSCORES')[2]) or 0
    for n = first, final do
      if not having[n - first + 1] and not waiting[n - first + 1]
          and (not wanted or wanted(groups[n])) then
        last = last + 1
        adds[#adds + 1] = last
        adds[#adds + 1] = groups[n]
      end
    end
  end)
  in_chunks(adds, function(first, final)
    redis.call('ZADD', turns_key, unpack(adds, first, final))
  end)
end

-- give_turns for one group.
local function give_turn(turns_key, throttled_key, group)
  give_turns(turns_key, throttled_key, {group})
end

-- Note a rate limit's wait (``group`` may start again at ``at``) for the dispatchers,
-- waking one when it comes before every other wait.
local function throttle(throttled_key, wake_key, group, at)
  local head = redis.call('ZRANGE', throttled_key, 0, 0, 'WITHSCORES')
  redis.call('ZADD', throttled_key, at, group)
  if not head[2] or at < tonumber(head[2]) then
    if redis.call('LLEN', wake_key) == 0 then
      redis.call('RPUSH', wake_key, 1)
    end
  end
end
