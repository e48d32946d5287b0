-- promote_due: move due task ids from scheduled and the delayed buckets to ready, and stage
-- delayed tasks due soon (by ARGV[4]) from their buckets into scheduled, at most ARGV[3]
-- tasks in all per call.
-- KEYS[1] scheduled       ZSET  task id -> run-at (ms): staged, retried and re-entered tasks
-- KEYS[2] ready           LIST
-- KEYS[3] leases          ZSET  "<worker>|<task id>" -> lease deadline (ms)
-- KEYS[4] stats           HASH
-- KEYS[5] workers         ZSET  worker id -> last heartbeat (ms)
-- KEYS[6] cron_next       ZSET  cron job name -> next tick (ms)
-- KEYS[7] early           HASH  task id -> run-at (ms), for ids moved before their run-at
-- KEYS[8] reaped          ZSET  reaped worker id -> when to look at its list once more (ms)
-- KEYS[9] delayed         ZSET  bucket name -> earliest run-at in that bucket (µs)
-- KEYS[10] delayed_layout HASH  generation, tasks (how many the buckets hold)
-- KEYS[11] limits        HASH  the queue's flow control (flow.lua: config_key); while it
--         exists, due tasks go to the due set by rank and turns, not to ready
-- KEYS[12] flow records  HASH  task id -> priority, cost, rank, group (flow.lua)
-- KEYS[13] due           ZSET  due tasks of a queue under flow control, by group and rank
-- KEYS[14] turns         ZSET  group -> its turn
-- KEYS[15] throttled     ZSET  group -> when its rate limit lets it start (ms)
-- KEYS[16] rate state    ZSET  group -> theoretical arrival time (ms)
-- KEYS[17] running       ZSET  "<group>\0<lease member>" of started tasks
-- KEYS[18] wake          LIST  the dispatchers' alarm: rung to go on feeding
-- KEYS[19] cron_backfill_due ZSET cron job name -> when its backfill fires a tick (ms)
-- KEYS[20] holds         HASH  (flow.lua): a rate wait's or a snooze's end is noted as its
--         group gets its turn back; notes of groups with no due task left are dropped
-- KEYS[21..] delayed buckets the caller saw due (ZSET task id -> run-at in µs), each named
--         KEYS[9] .. ':' .. its name in `delayed`
-- ARGV[1] now (ms, server clock)
-- ARGV[2] promote ids due up to this time (ms, >= now): moving a task a few ms ahead
--         takes the hand-over to a worker off its critical path; the run-at goes along
--         in `early`, and the claiming worker waits for it, so no task starts early.
-- ARGV[3] most ids to move (promoted and staged together)
-- ARGV[4] stage delayed tasks due up to this time (ms, >= ARGV[2]; ARGV[2] when absent):
--         each one not promoted moves from its bucket into scheduled, at its run-at, so
--         that when it comes due it is promoted from one sorted set rather than from a
--         bucket of its own (one bucket per task of a burst behind a large backlog, each a
--         cache miss on the server when it is due)
-- Returns: {promoted count, next run-at or -1, earliest lease deadline or -1, oldest worker
-- heartbeat or -1, next cron tick (or backfill tick) or -1, next look at a reaped
-- worker's list or -1,
-- {name, earliest run-at (µs), ...} of the buckets still due for promotion or staging, or
-- of the next few to be, staged count},
-- so the caller knows how long it may sleep without another round trip, and which
-- buckets to pass next time (a script touches only the keys it is given).
-- Counters in stats are bumped with redis.pcall: one that is not a number (edited by
-- hand) is left alone and never fails the step.
-- Under flow control (flow.lua), the promoted tasks are filed in the due set instead of
-- ready, groups whose rate limit has let go get their turn back, spent rates are
-- forgotten (a minute after), and one task that may start is put in ready to wake a
-- worker; the next run-at returned is then also the earliest time a rate limit lets go.
-- @include probes
-- @include delayed_buckets
-- @include microseconds
-- @include chunks
-- @include flow
-- @include flow_turns
-- @include flow_filing
-- @include flow_pick
-- @include flow_holds
local NEXT_BUCKETS = 16
local now, upto, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local stage_upto = math.max(upto, tonumber(ARGV[4]) or upto)
local ids, ahead, run_ats = {}, {}, {}
local staged, staged_count = {}, 0  -- run-at (ms text), id, ... for scheduled
local upto_us = upto * 1000
-- Take entries {id, score, ...}: those due by upto are promoted, the rest (only from a
-- bucket, read up to stage_upto) staged. Scores in µs when ``us``, else ms. One promoted
-- before its run-at leaves that run-at (ms) in `early`.
local function take(entries, us)
  local taken = {}
  for i = 1, #entries, 2 do
    local score = tonumber(entries[i + 1])
    taken[#taken + 1] = entries[i]
    if us and score > upto_us then
      staged[2 * staged_count + 1] = ms_text(score)
      staged[2 * staged_count + 2] = entries[i]
      staged_count = staged_count + 1
    else
      ids[#ids + 1] = entries[i]
      run_ats[#ids] = us and score / 1000 or score
      if (us and score > now * 1000) or (not us and score > now) then
        ahead[#ahead + 1] = entries[i]
        ahead[#ahead + 1] = us and ms_text(score) or entries[i + 1]
      end
    end
  end
  return taken
end
local from_scheduled = take(redis.call('ZRANGE', KEYS[1], '-inf', upto, 'BYSCORE', 'LIMIT', 0,
  most, 'WITHSCORES'), false)
-- From each bucket given, its due entries; every bucket given is indexed again at its
-- true earliest afterwards (reindex): one that another dispatcher emptied meanwhile, or
-- whose score was left too early, cannot keep a caller coming back.
-- A number given to a command is formatted slowly: the bound goes as text.
local stage_text = string.format('%d', stage_upto * 1000)
local from_buckets = {}  -- KEYS index -> ids taken from that bucket
local bucketed = 0
for key = 21, #KEYS do
  local room = most - #ids - staged_count
  if room <= 0 then
    break
  end
  from_buckets[key] = take(redis.call('ZRANGE', KEYS[key], '-inf', stage_text, 'BYSCORE',
    'LIMIT', 0, room, 'WITHSCORES'), true)
  bucketed = bucketed + #from_buckets[key]
end
-- A script that fails half way keeps the writes it made: every key written below is
-- read first (a read of the wrong type fails too), or is the first write (ready), so a
-- key of the wrong type fails the call with nothing written. The layout's count is
-- bumped with pcall, as counters are.
local next_lease = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
local oldest_beat = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
local next_tick = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
local next_backfill = redis.call('ZRANGE', KEYS[19], 0, 0, 'WITHSCORES')
if next_backfill[2] and (not next_tick[2] or tonumber(next_backfill[2]) < tonumber(next_tick[2])) then
  next_tick = next_backfill
end
local next_look = redis.call('ZRANGE', KEYS[8], 0, 0, 'WITHSCORES')
if #ahead > 0 then
  probe_hashes(KEYS[7])
end
if #KEYS >= 21 then
  probe_zsets(KEYS[9])
end
local flowing = flow_on(KEYS[11])
if flowing then
  probe_hashes(KEYS[12])
  probe_zsets(KEYS[13], KEYS[14], KEYS[16])
  probe_hashes(KEYS[20])
end
if #ids > 0 then
  if flowing then
    file_due(KEYS[12], KEYS[13], KEYS[14], KEYS[15], ids, run_ats)
  else
    redis.call('RPUSH', KEYS[2], unpack(ids))
  end
  if #ahead > 0 then
    redis.call('HSET', KEYS[7], unpack(ahead))
  end
  if #from_scheduled > 0 then
    redis.call('ZREM', KEYS[1], unpack(from_scheduled))
  end
  redis.pcall('HINCRBY', KEYS[4], 'promoted', #ids)
end
if staged_count > 0 then
  -- Before the buckets lose them (scheduled was read above, so it is a sorted set).
  redis.call('ZADD', KEYS[1], unpack(staged))
end
for key, taken in pairs(from_buckets) do
  if #taken > 0 then
    redis.call('ZREM', KEYS[key], unpack(taken))
  end
  reindex(KEYS[key], KEYS[9])
end
if bucketed > 0 then
  redis.pcall('HINCRBY', KEYS[10], 'tasks', -bucketed)
  forget_layout_if_empty(KEYS[9], KEYS[10])
end
local next_due = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2] or '-1'
if flowing then
  local released = redis.call('ZRANGE', KEYS[15], '-inf', now, 'BYSCORE', 'LIMIT', 0, 1000,
    'WITHSCORES')
  if #released > 0 then
    local groups, waiting, ends = {}, {}, {}
    for i = 1, #released, 2 do
      local group = released[i]
      groups[#groups + 1] = group
      if group == QUEUE_GROUP or first_of(KEYS[13], group) then
        -- The wait's end, not this pass: the dispatcher's own delay is lateness.
        ends[#ends + 1] = group
        ends[#ends + 1] = released[i + 1]
        if group ~= QUEUE_GROUP then
          waiting[#waiting + 1] = group
        end
      end
    end
    redis.call('ZREM', KEYS[15], unpack(groups))
    give_turns(KEYS[14], KEYS[15], waiting)
    in_chunks(ends, function(first, last)
      redis.call('HSET', KEYS[20], unpack(ends, first, last))
    end)
  end
  -- A few notes at random: one of a group with no due task left means nothing (its
  -- tasks were cancelled, say), and goes, so the notes stay as many as the held keys.
  for _, group in ipairs(redis.call('HRANDFIELD', KEYS[20], 8)) do
    local due = group == QUEUE_GROUP and redis.call('ZCARD', KEYS[13]) > 0
      or group ~= QUEUE_GROUP and first_of(KEYS[13], group)
    if not due then
      redis.call('HDEL', KEYS[20], group)
    end
  end
  -- Spent rates long past mean nothing: dropped, a minute late so that a worker whose
  -- clock reads behind this dispatcher's still finds every one that holds it back.
  redis.call('ZREMRANGEBYSCORE', KEYS[16], '-inf', now - 60000)
  feed(KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16], KEYS[17], KEYS[3], KEYS[18],
    KEYS[2], now)
  note_holds(KEYS[20], now)
  local throttled = redis.call('ZRANGE', KEYS[15], 0, 0, 'WITHSCORES')[2]
  if throttled and (next_due == '-1' or tonumber(throttled) < tonumber(next_due)) then
    next_due = throttled
  end
end
-- The buckets still due for promotion or staging (more than one call could take), or else
-- the next few to be: a caller that wakes for them passes every one due by then in one call.
local earliest = redis.call('ZRANGE', KEYS[9], '-inf', stage_text, 'BYSCORE', 'LIMIT', 0, most,
  'WITHSCORES')
if #earliest == 0 then
  earliest = redis.call('ZRANGE', KEYS[9], 0, NEXT_BUCKETS - 1, 'WITHSCORES')
end
if earliest[2] and (next_due == '-1' or tonumber(earliest[2]) < tonumber(next_due) * 1000) then
  next_due = ms_text(earliest[2])
end
return {#ids, next_due, next_lease[2] or '-1', oldest_beat[2] or '-1', next_tick[2] or '-1',
  next_look[2] or '-1', earliest, staged_count}
