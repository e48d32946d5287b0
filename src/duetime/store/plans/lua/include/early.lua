-- note_due_at: when a task is due again, noted in early_key.
-- note_due_at(early_key, id, at): note in `early` (task id -> ms) that task ``id`` became
-- due again at ``at``, which its next attempt's lateness counts from; a note already
-- there, of an id never claimed, is the earlier due time: kept.
-- HGET then HSET: a worker runs this (release_worker, and reap_worker too), and its ACL
-- grants no set-if-absent. pcall: a damaged key must not fail the step.
local function note_due_at(early_key, id, at)
  if not redis.pcall('HGET', early_key, id) then
    redis.pcall('HSET', early_key, id, at)
  end
end
