-- The record of workers presumed dead, in gone_key (the queue's gone_workers list).
-- The list is newest first: reap_worker adds an entry when it takes a silent worker's
-- tasks back, so that an operator keeps seeing, for a while, that the worker went silent,
-- since when, and which tasks were taken back. An entry is a msgpack array: worker id,
-- its last heartbeat (ms; false when it was not registered: a list left behind), when it
-- was reaped (ms), how many tasks were re-entered, and the ids of the first GONE_IDS_KEPT
-- of them. The list keeps the newest GONE_KEPT entries (store/operating.py reads as
-- many). Written with redis.pcall: a damaged key, or a user not granted its commands,
-- never fails the reap.
local GONE_KEPT = 50
local GONE_IDS_KEPT = 20

-- note_gone_worker(gone_key, worker, beat, now, ids): record that ``worker`` (last
-- heartbeat ``beat``, or nil) was reaped at ``now``, its tasks ``ids`` re-entered.
local function note_gone_worker(gone_key, worker, beat, now, ids)
  local kept = {}
  for n = 1, math.min(#ids, GONE_IDS_KEPT) do
    kept[n] = ids[n]
  end
  local entry = cmsgpack.pack({worker, tonumber(beat) or false, now, #ids, kept})
  local pushed = redis.pcall('LPUSH', gone_key, entry)
  if type(pushed) == 'number' and pushed > GONE_KEPT then
    redis.pcall('LTRIM', gone_key, 0, GONE_KEPT - 1)
  end
end
